//! FNV-1a (64-bit), the one stable hash Flotilla derives names, label values, annotations and
//! routing keys from: bytes go in, a `u64` comes out that is the same on every version and
//! platform (unlike `DefaultHasher`), so a value written by one release is recomputed by the next.
//! [`fnv1a64`] hashes one slice; [`Fnv1a64`] hashes several parts as one stream, optionally
//! seeded.

/// The FNV-1a 64-bit offset basis.
const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// The FNV-1a 64-bit prime.
const PRIME: u64 = 0x0100_0000_01b3;

/// FNV-1a 64 of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    Fnv1a64::new().write(bytes).finish()
}

/// FNV-1a 64 over a stream of parts: `Fnv1a64::new().write(a).write(b).finish()` equals
/// [`fnv1a64`] of `a` and `b` concatenated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fnv1a64(u64);

impl Fnv1a64 {
    /// A hasher at the offset basis (plain FNV-1a).
    pub const fn new() -> Self {
        Self(OFFSET_BASIS)
    }

    /// A hasher whose starting state is the offset basis XOR `seed` (seed 0 is plain FNV-1a):
    /// one input hashes to unrelated values under different seeds.
    pub const fn with_seed(seed: u64) -> Self {
        Self(OFFSET_BASIS ^ seed)
    }

    /// The hasher after `bytes`.
    #[must_use]
    pub fn write(self, bytes: &[u8]) -> Self {
        Self(bytes.iter().fold(self.0, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME)))
    }

    /// The hash of everything written.
    pub const fn finish(self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a64 {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_test_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_stream_of_parts_hashes_as_their_concatenation() {
        assert_eq!(Fnv1a64::new().write(b"foo").write(b"").write(b"bar").finish(), fnv1a64(b"foobar"));
        assert_eq!(Fnv1a64::default(), Fnv1a64::new());
    }

    #[test]
    fn a_seed_xors_the_offset_basis_and_seed_zero_is_plain() {
        assert_eq!(Fnv1a64::with_seed(0).write(b"foobar").finish(), fnv1a64(b"foobar"));
        assert_eq!(Fnv1a64::with_seed(7).finish(), 0xcbf2_9ce4_8422_2325 ^ 7);
        assert_ne!(Fnv1a64::with_seed(7).write(b"a").finish(), fnv1a64(b"a"));
    }
}
