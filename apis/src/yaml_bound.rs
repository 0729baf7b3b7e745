//! Bounds on what YAML text costs, checked before it is converted. Nesting first: a linear
//! pass over the text ([`depth`]) refuses a document nested past [`depth::MAX_DEPTH`] levels
//! with its line and column, before libyaml (whose time grows with the square of the flow
//! nesting) sees it. Then the nodes: YAML aliases repeat the node an anchor names, so a 21 KB
//! document whose anchor is referenced 3,000 times by nodes that are each referenced 3,000
//! times expands to millions of nodes (12 s and 950 MB on this machine). One pass counts the
//! nodes the parser produces, aliases expanded as it replays them, and stops at the first
//! bound passed: [`MAX_YAML_NODES`] for one document, and — since a thousand documents just
//! under that bound cost a thousand times as much — [`MAX_FILE_ALIAS_NODES`] and
//! [`MAX_RUN_ALIAS_NODES`] for what aliases add beyond the text itself (counted nodes past
//! two per byte, more than any alias-free text holds) over a file and over all files read
//! together ([`Budget`]). The counts cost no memory and end as soon as a bound is passed.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};

#[path = "yaml_bound/depth.rs"]
pub mod depth;

/// Nodes one document may expand to (an object of Flotilla's has a few hundred).
pub const MAX_YAML_NODES: u64 = 100_000;
/// Nodes that aliases may add, beyond two per byte of the documents' text, over one file.
pub const MAX_FILE_ALIAS_NODES: u64 = 100_000;
/// Nodes that aliases may add, beyond two per byte of the documents' text, over one run
/// (every file `fleetctl validate` or `plan` reads together).
pub const MAX_RUN_ALIAS_NODES: u64 = 1_000_000;

/// Documents up to this long, without `*`, are within the bound by their length alone.
const ALIAS_FREE_BYTES: usize = (MAX_YAML_NODES / 4) as usize;

/// What aliases may still add: over the file being read and over the whole run.
#[derive(Clone, Debug)]
pub struct Budget {
    file_left: u64,
    run_left: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Self { file_left: MAX_FILE_ALIAS_NODES, run_left: MAX_RUN_ALIAS_NODES }
    }
}

impl Budget {
    /// A new file of the same run: the file's allowance again, the run's what is left of it.
    pub fn next_file(&mut self) {
        self.file_left = MAX_FILE_ALIAS_NODES;
    }
}

/// Why a document was refused before conversion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 1-based line and column in the document's text where the bound was passed (`None`:
    /// the document as a whole).
    pub at: Option<(usize, usize)>,
    /// What bound was passed.
    pub what: String,
    /// What to change.
    pub fix: &'static str,
}

impl Refusal {
    /// The sentence, its position counted from `first_line`, the document's line in its file.
    pub fn message(&self, first_line: usize) -> String {
        match self.at {
            Some((line, column)) => {
                format!("{} at line {}, column {column}; {}", self.what, first_line + line - 1, self.fix)
            }
            None => format!("{}; {}", self.what, self.fix),
        }
    }
}

/// `Err` when `text` (one document) nests past [`depth::MAX_DEPTH`] or expands past
/// [`MAX_YAML_NODES`] nodes; [`Budget`] takes what its aliases add. Syntax errors are left to
/// the real conversion, which reports them with their position.
pub fn check(text: &str, budget: &mut Budget) -> Result<(), Refusal> {
    depth::check(text).map_err(|at| Refusal {
        at: Some((at.line, at.column)),
        what: format!(
            "nests more than {} levels deep (block collections and flow brackets together)",
            depth::MAX_DEPTH
        ),
        fix: "flatten it",
    })?;
    // Without an alias nothing is repeated, and no YAML syntax makes more than two nodes of
    // one byte (`?` alone: a null key and its null value): a short document without `*`
    // cannot pass the bound, and is not parsed an extra time to count.
    let aliases = text.contains('*');
    if text.len() <= ALIAS_FREE_BYTES && !aliases {
        return Ok(());
    }
    let own = 2 * text.len() as u64;
    let (file, run) = if aliases { (budget.file_left, budget.run_left) } else { (u64::MAX, u64::MAX) };
    let (file, run) = (own.saturating_add(file), own.saturating_add(run));
    let limit = MAX_YAML_NODES.min(file).min(run);
    let count = counted(text, limit);
    if aliases {
        // What the aliases added is spent whatever the outcome: a thousand documents each
        // refused at the bound cost a thousand counts.
        let added = count.min(limit).saturating_sub(own);
        budget.file_left -= added.min(budget.file_left);
        budget.run_left -= added.min(budget.run_left);
    }
    if count <= limit {
        return Ok(());
    }
    Err(if limit == MAX_YAML_NODES {
        Refusal {
            at: None,
            what: format!(
                "the document expands to more than {MAX_YAML_NODES} nodes (YAML aliases repeat what their anchor names)"
            ),
            fix: "write it out without nested aliases",
        }
    } else if limit == file {
        Refusal {
            at: None,
            what: format!(
                "this file's documents together expand to more than {MAX_FILE_ALIAS_NODES} nodes beyond their text through YAML aliases (this document passed the bound)"
            ),
            fix: "write them out without aliases",
        }
    } else {
        Refusal {
            at: None,
            what: format!(
                "the files read together expand to more than {MAX_RUN_ALIAS_NODES} nodes beyond their text through YAML aliases (this document passed the bound)"
            ),
            fix: "write them out without aliases, or read fewer files at once",
        }
    })
}

/// [`check`] over a whole stream read on its own (a kubeconfig, a provider file): the depth,
/// then every document's nodes against one [`MAX_YAML_NODES`] together. The message names
/// the line where nesting passed its bound.
pub fn check_stream(text: &str) -> Result<(), String> {
    depth::check(text).map_err(|at| {
        format!(
            "nests more than {} levels deep at line {}, column {}; flatten it",
            depth::MAX_DEPTH,
            at.line,
            at.column
        )
    })?;
    if text.len() <= ALIAS_FREE_BYTES && !text.contains('*') {
        return Ok(());
    }
    let count = Cell::new(0u64);
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        if (Counter { count: &count, limit: MAX_YAML_NODES }).deserialize(document).is_err() {
            break;
        }
    }
    if count.get() > MAX_YAML_NODES {
        return Err(format!(
            "expands to more than {MAX_YAML_NODES} nodes (YAML aliases repeat what their anchor names); write it out without nested aliases"
        ));
    }
    Ok(())
}

/// Nodes of `text`, aliases expanded, counted up to `limit + 1`.
fn counted(text: &str, limit: u64) -> u64 {
    let count = Cell::new(0u64);
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let _ = (Counter { count: &count, limit }).deserialize(de);
    count.get()
}

#[derive(Clone, Copy)]
struct Counter<'a> {
    count: &'a Cell<u64>,
    limit: u64,
}

impl Counter<'_> {
    fn tick<E: serde::de::Error>(&self) -> Result<(), E> {
        self.count.set(self.count.get() + 1);
        if self.count.get() > self.limit { Err(E::custom("too many nodes")) } else { Ok(()) }
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

    fn one(text: &str) -> Result<(), Refusal> {
        check(text, &mut Budget::default())
    }

    #[test]
    fn nested_aliases_past_the_bound_are_refused() {
        assert!(one(&laughs(2, 3000)).is_err_and(|e| e.message(1).contains("more than 100000 nodes")));
        assert!(one(&laughs(2, 400)).is_err());
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
            let counter = Counter { count: &count, limit: MAX_YAML_NODES };
            let _ = counter.deserialize(serde_yaml_ng::Deserializer::from_str(&doc));
            assert!(count.get() <= 2 * doc.len() as u64 && count.get() < MAX_YAML_NODES / 2, "{}", count.get());
        }
        // Absence: an alias sends even a short document through the count, which refuses it.
        assert!(one(&laughs(2, 400)).is_err());
        assert!(laughs(2, 400).len() < ALIAS_FREE_BYTES);
    }

    #[test]
    fn ordinary_documents_and_small_aliases_pass() {
        assert_eq!(one(&laughs(2, 10)), Ok(()));
        assert_eq!(one("kind: ModelDeployment\nspec: {replicas: 2, tags: !t [1, 2]}\n"), Ok(()));
        assert_eq!(one("not: [valid"), Ok(()), "syntax errors are reported by the conversion");
    }

    #[test]
    fn deep_nesting_is_refused_with_its_line_before_any_count() {
        let deep = format!("spec:\n  a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let e = one(&deep).unwrap_err();
        assert_eq!(e.at, Some((2, 68)), "the 63rd `[` of line 2 opens level 65");
        let message = e.message(10);
        assert!(
            message.contains("nests more than 64 levels deep") && message.contains("at line 11, column 68"),
            "{message}"
        );
    }

    #[test]
    fn aliases_spread_over_the_documents_of_a_file_share_one_bound() {
        // Each document alone is under the per-document bound (200 x 401 = 80,200 nodes).
        let doc = laughs(2, 200);
        let mut budget = Budget::default();
        assert_eq!(check(&doc, &mut budget), Ok(()));
        let e = check(&doc, &mut budget).unwrap_err();
        assert!(e.message(1).contains("this file's documents together expand to more than 100000 nodes"), "{e:?}");
        assert_eq!(e.at, None, "the document's own line: its location");
        // Spent: every later aliasing document of the file is counted only as far as its text.
        for _ in 0..50 {
            assert!(check(&doc, &mut budget).is_err());
        }
        // Absence: documents whose aliases add nothing beyond their text, and alias-free ones,
        // still pass in the same file.
        assert_eq!(check(&laughs(2, 3), &mut budget), Ok(()));
        assert_eq!(check(&format!("a: [{}0]\n", "0,".repeat(20_000)), &mut budget), Ok(()));
        // A new file: its own allowance again.
        budget.next_file();
        assert_eq!(check(&doc, &mut budget), Ok(()));
    }

    #[test]
    fn aliases_spread_over_the_files_of_a_run_share_one_bound() {
        let doc = laughs(2, 200);
        let mut budget = Budget::default();
        let mut passed = 0;
        let refusal = loop {
            budget.next_file();
            match check(&doc, &mut budget) {
                Ok(()) => passed += 1,
                Err(e) => break e,
            }
            assert!(passed < 100, "the run's bound never answered");
        };
        // 1,000,000 / (80,600 - 2 x 2,030 bytes) files pass, then the run's bound answers.
        assert_eq!(passed, 13);
        assert!(
            refusal.message(1).contains("the files read together expand to more than 1000000 nodes"),
            "{refusal:?}"
        );
        budget.next_file();
        assert!(check(&doc, &mut budget).is_err(), "a new file does not refill the run");
    }

    #[test]
    fn a_stream_read_on_its_own_is_bounded_as_a_whole() {
        assert_eq!(check_stream("a: 1\n---\nb: [*x]\n"), Ok(()));
        let bomb = format!("{}---\n{}", laughs(2, 200), laughs(2, 200));
        assert!(check_stream(&laughs(2, 200)).is_ok());
        assert!(check_stream(&bomb).is_err_and(|e| e.contains("more than 100000 nodes")), "the documents add up");
        let deep = format!("clusters:\n- cluster: {}\n", "{a: ".repeat(70));
        assert!(check_stream(&deep).is_err_and(|e| e.contains("line 2, column")));
    }
}
