//! Names and label values Flotilla writes, kept within Kubernetes' 63 characters: as they are
//! when they fit, else shortened with a stable hash, so one input always gives one output on
//! every version and platform (the controller, the providers and the solver compute the same
//! value independently).

/// The longest label value and DNS label Kubernetes accepts.
pub const MAX_LABEL: usize = 63;

/// FNV-1a over `parts`, each followed by a `/` (a character no part may hold): stable across
/// versions and platforms, unlike `DefaultHasher`; `("a-b", "c")` and `("a", "b-c")` differ.
pub fn fnv(parts: &[&str]) -> u32 {
    let h = parts
        .iter()
        .flat_map(|p| p.bytes().chain(std::iter::once(b'/')))
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    h as u32
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

/// The key of a CapacityClaim (and of the ModelDeployment of the same namespace and name) on
/// the nodes it obtains: the value of their `flotilla.dev/claim` label and taint, and of the
/// toleration of the deployment's pods. `<namespace>.<name>`, bounded as a label value.
pub fn claim_key(namespace: &str, name: &str) -> String {
    label_value(&format!("{namespace}.{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_keys_are_todays_when_they_fit_and_valid_label_values_when_long() {
        assert_eq!(claim_key("ml", "llama"), "ml.llama");
        let long = claim_key("ml", &"n".repeat(200));
        assert!(long.len() <= MAX_LABEL && long.starts_with("ml.nnn"), "{long}");
        assert!(long.ends_with(|c: char| c.is_ascii_alphanumeric()), "{long}");
        assert_ne!(long, claim_key("ml", &"n".repeat(201)), "the hash takes the whole");
        assert_eq!(long, claim_key("ml", &"n".repeat(200)), "stable");
    }
}
