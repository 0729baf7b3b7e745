//! Names and label values Flotilla writes, kept within Kubernetes' 63 characters: as they are
//! when they fit, else shortened with a stable hash, so one input always gives one output on
//! every version and platform (the controller, the providers and the solver compute the same
//! value independently).

use crate::fnv::Fnv1a64;

/// The longest label value and DNS label Kubernetes accepts.
pub const MAX_LABEL: usize = 63;

/// FNV-1a over `parts`, each followed by a `/` (a character no part may hold): stable across
/// versions and platforms, unlike `DefaultHasher`; `("a-b", "c")` and `("a", "b-c")` differ.
pub fn fnv(parts: &[&str]) -> u32 {
    parts.iter().fold(Fnv1a64::new(), |h, p| h.write(p.as_bytes()).write(b"/")).finish() as u32
}

/// `text` if it has at most `max` characters, else its first characters (ending in a letter or
/// digit) and `-` and a hash of `hashed`: the same input always gives the same output.
pub fn shorten(text: &str, max: usize, hashed: &[&str]) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let head: String = text.chars().take(max - 9).collect();
    let head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{:08x}", fnv(hashed))
}

/// A label value: `value` as it is when it has at most 63 characters (every value Flotilla
/// wrote before stays as it was), else shortened with a hash of the whole value.
pub fn label_value(value: &str) -> String {
    shorten(value, MAX_LABEL, &[value])
}

/// The owner key of a ModelDeployment, ModelCache or CapacityClaim: `<namespace>.<name>`,
/// bounded as a label value. The value of `flotilla.dev/deployment` and `flotilla.dev/cache` on
/// the objects they own (member objects, a deployment's CapacityClaim), and of
/// `flotilla.dev/claim` on the nodes a claim obtains, their taint and the toleration of the
/// deployment's pods (a claim has its deployment's namespace and name). Every builder and every
/// reader of those labels uses this one function, so they agree on long names too.
pub fn owner_key(namespace: &str, name: &str) -> String {
    label_value(&format!("{namespace}.{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_keys_are_todays_when_they_fit_and_valid_label_values_when_long() {
        assert_eq!(owner_key("ml", "llama"), "ml.llama");
        let long = owner_key("ml", &"n".repeat(200));
        assert!(long.len() <= MAX_LABEL && long.starts_with("ml.nnn"), "{long}");
        assert!(long.ends_with(|c: char| c.is_ascii_alphanumeric()), "{long}");
        assert_ne!(long, owner_key("ml", &"n".repeat(201)), "the hash takes the whole");
        assert_eq!(long, owner_key("ml", &"n".repeat(200)), "stable");
    }
}
