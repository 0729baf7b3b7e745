//! A bound on what one YAML document expands to. YAML aliases repeat the node an anchor
//! names, so a 21 KB document whose anchor is referenced 3,000 times by nodes that are each
//! referenced 3,000 times expands to millions of nodes (12 s and 950 MB on this machine).
//! Before a document is converted, one pass counts the nodes the parser produces, aliases
//! expanded as the parser replays them, and stops at [`MAX_YAML_NODES`]: the count costs no
//! memory and ends as soon as the bound is passed.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};

/// Nodes one document may expand to (an object of Flotilla's has a few hundred).
pub const MAX_YAML_NODES: u64 = 100_000;

/// `Err` with a sentence when `text` (one document) expands past [`MAX_YAML_NODES`] nodes;
/// syntax errors are left to the real conversion, which reports them with their position.
pub fn check(text: &str) -> Result<(), String> {
    // Without an alias nothing is repeated, and no YAML syntax makes more than two nodes of
    // one byte (`?` alone: a null key and its null value): a short document without `*`
    // cannot pass the bound, and is not parsed an extra time to count.
    if text.len() <= ALIAS_FREE_BYTES && !text.contains('*') {
        return Ok(());
    }
    counted(text)
}

/// Documents up to this long, without `*`, are within the bound by their length alone.
const ALIAS_FREE_BYTES: usize = (MAX_YAML_NODES / 4) as usize;

fn counted(text: &str) -> Result<(), String> {
    let count = Cell::new(0u64);
    let de = serde_yaml_ng::Deserializer::from_str(text);
    match (Counter { count: &count }).deserialize(de) {
        Err(_) if count.get() > MAX_YAML_NODES => Err(format!(
            "the document expands to more than {MAX_YAML_NODES} nodes (YAML aliases repeat what their anchor names); write it out without nested aliases"
        )),
        _ => Ok(()),
    }
}

#[derive(Clone, Copy)]
struct Counter<'a> {
    count: &'a Cell<u64>,
}

impl Counter<'_> {
    fn tick<E: serde::de::Error>(&self) -> Result<(), E> {
        self.count.set(self.count.get() + 1);
        if self.count.get() > MAX_YAML_NODES { Err(E::custom("too many nodes")) } else { Ok(()) }
    }
}

impl<'de> DeserializeSeed<'de> for Counter<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Counter<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.tick()
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.tick()
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.tick()
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.tick()
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.tick()
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.tick()
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.tick()
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.tick()?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.tick()?;
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // A tagged node (`!tag value`): count the value.
        let ((), variant) = data.variant_seed(self)?;
        variant.newtype_variant_seed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `levels` levels of `width` aliases each, on one anchored scalar.
    fn laughs(levels: usize, width: usize) -> String {
        let mut text = String::from("a0: &a0 [x]\n");
        for l in 1..=levels {
            let refs = vec![format!("*a{}", l - 1); width].join(", ");
            text.push_str(&format!("a{l}: &a{l} [{refs}]\n"));
        }
        text
    }

    #[test]
    fn nested_aliases_past_the_bound_are_refused() {
        assert!(check(&laughs(2, 3000)).is_err_and(|e| e.contains("more than 100000 nodes")));
        assert!(check(&laughs(2, 400)).is_err());
    }

    #[test]
    fn short_alias_free_documents_are_within_the_bound_by_length() {
        // The densest alias-free documents, as long as the shortcut allows: each stays far
        // below the bound when counted, so skipping the count loses nothing.
        let fill = |unit: &str| unit.repeat(ALIAS_FREE_BYTES / unit.len());
        for doc in [fill("?\n"), fill("- "), format!("[{}0]", fill("0,")), fill("a:\n"), format!("{{{}a}}", fill("a,"))]
        {
            assert!(doc.len() <= ALIAS_FREE_BYTES + 3);
            let count = Cell::new(0u64);
            let _ = (Counter { count: &count }).deserialize(serde_yaml_ng::Deserializer::from_str(&doc));
            assert!(count.get() <= 2 * doc.len() as u64 && count.get() < MAX_YAML_NODES / 2, "{}", count.get());
        }
        // Absence: an alias sends even a short document through the count, which refuses it.
        assert!(check(&laughs(2, 400)).is_err());
        assert!(laughs(2, 400).len() < ALIAS_FREE_BYTES);
    }

    #[test]
    fn ordinary_documents_and_small_aliases_pass() {
        assert_eq!(check(&laughs(2, 10)), Ok(()));
        assert_eq!(check("kind: ModelDeployment\nspec: {replicas: 2, tags: !t [1, 2]}\n"), Ok(()));
        assert_eq!(check("not: [valid"), Ok(()), "syntax errors are reported by the conversion");
    }
}
