//! The simulated prefix cache and the deterministic random source: prompt tokens go in as
//! chained block hashes, the number of leading blocks already cached comes out, and least
//! recently used blocks are evicted when the cache is full.

use std::collections::{BTreeMap, HashMap};

/// FNV-1a over bytes, seeded; stable across runs and platforms.
pub fn fnv(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// SplitMix64: a tiny deterministic generator, enough for simulated text.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// What one lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// Prompt tokens looked up (whole blocks only).
    pub queried_tokens: u64,
    /// Tokens in leading blocks that were already cached.
    pub hit_tokens: u64,
    /// Blocks that had to be computed.
    pub missed_blocks: u64,
}

/// An LRU set of block hashes.
#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    capacity: usize,
    tick: u64,
    blocks: HashMap<u64, u64>,
    by_age: BTreeMap<u64, u64>,
}

impl PrefixCache {
    /// A cache of `capacity` blocks of `block_size` tokens.
    pub fn new(block_size: usize, capacity: usize) -> Self {
        PrefixCache {
            block_size: block_size.max(1),
            capacity,
            tick: 0,
            blocks: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    /// Blocks currently cached.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Capacity in blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Look the prompt's full blocks up and cache them all (hits refresh their age).
    pub fn lookup_insert(&mut self, tokens: &[&str]) -> Lookup {
        let mut prev = 0u64;
        let mut leading = true;
        let mut out = Lookup { queried_tokens: 0, hit_tokens: 0, missed_blocks: 0 };
        for block in tokens.chunks_exact(self.block_size) {
            let mut h = prev;
            for t in block {
                h = fnv(h, t.as_bytes());
            }
            prev = h;
            out.queried_tokens += self.block_size as u64;
            let hit = self.touch(h);
            if hit && leading {
                out.hit_tokens += self.block_size as u64;
            } else {
                leading = false;
                out.missed_blocks += 1;
            }
        }
        out
    }

    fn touch(&mut self, h: u64) -> bool {
        self.tick += 1;
        let hit = match self.blocks.insert(h, self.tick) {
            Some(old) => {
                self.by_age.remove(&old);
                true
            }
            None => false,
        };
        self.by_age.insert(self.tick, h);
        while self.blocks.len() > self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else { break };
            self.blocks.remove(&oldest);
        }
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefix_hits_and_lru_evicts() {
        let mut c = PrefixCache::new(2, 3);
        let a: Vec<&str> = "a b c d e".split(' ').collect();
        assert_eq!(c.lookup_insert(&a), Lookup { queried_tokens: 4, hit_tokens: 0, missed_blocks: 2 });
        let b: Vec<&str> = "a b c x".split(' ').collect();
        assert_eq!(c.lookup_insert(&b), Lookup { queried_tokens: 4, hit_tokens: 2, missed_blocks: 1 });
        assert_eq!(c.len(), 3);
        let d: Vec<&str> = "q r".split(' ').collect();
        c.lookup_insert(&d);
        assert_eq!(c.len(), 3);
        // "a b" was refreshed by the second lookup, so "a b c d" (oldest) was evicted.
        assert_eq!(c.lookup_insert(&a).hit_tokens, 2);
    }

    #[test]
    fn rng_is_deterministic() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!(a.next_u64(), b.next_u64());
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }
}
