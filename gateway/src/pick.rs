//! Choosing a cluster, as a pure function: a snapshot of the allowed, available candidates
//! (load, latency, weight, whether this request already tried them) and the request's prefix
//! key go in; the index of the cluster to try comes out. Prefix affinity uses rendezvous
//! hashing with a bounded-load cap, so a shared prefix sticks to one cluster until that
//! cluster carries more than `load_factor` times the mean load.

use flotilla_apis::fnv::Fnv1a64;

use crate::config::RoutingMode;

/// One candidate as the chooser sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate<'a> {
    /// Cluster name (hashed for affinity), borrowed from the table: no copy per request.
    pub name: &'a str,
    /// Route weight (≥ 1).
    pub weight: u32,
    /// In-flight requests from this gateway.
    pub inflight: u64,
    /// Scraped queue depth (`vllm:num_requests_waiting`).
    pub queue_depth: u64,
    /// Latency EWMA in milliseconds.
    pub ewma_ms: f64,
    /// Whether this request already tried it.
    pub tried: bool,
}

impl Candidate<'_> {
    fn load(&self) -> u64 {
        self.inflight + self.queue_depth
    }
}

/// FNV-1a, seeded.
pub fn hash(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = Fnv1a64::with_seed(seed).write(bytes).finish();
    // Finalise (splitmix) so nearby inputs spread.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The prefix key of a prompt: a hash of its first `bytes` bytes (none for an empty prompt).
pub fn prefix_key(prompt: &str, bytes: usize) -> Option<u64> {
    if prompt.is_empty() || bytes == 0 {
        return None;
    }
    let b = prompt.as_bytes();
    Some(hash(0, &b[..b.len().min(bytes)]))
}

fn least_load(c: &[Candidate<'_>], idx: &[usize]) -> Option<usize> {
    idx.iter().copied().min_by(|&a, &b| {
        let (x, y) = (&c[a], &c[b]);
        let lx = (x.load() + 1) as f64 / f64::from(x.weight);
        let ly = (y.load() + 1) as f64 / f64::from(y.weight);
        lx.total_cmp(&ly).then(x.ewma_ms.total_cmp(&y.ewma_ms)).then(x.name.cmp(y.name))
    })
}

/// Rendezvous order of `idx` for `key`, weighted: highest score first.
pub fn rendezvous(c: &[Candidate<'_>], idx: &[usize], key: u64) -> Vec<usize> {
    let score = |i: usize| {
        let u = (hash(key, c[i].name.as_bytes()) >> 11) as f64 / (1u64 << 53) as f64;
        let u = u.clamp(1e-12, 1.0 - 1e-12);
        f64::from(c[i].weight) / -u.ln()
    };
    let mut order: Vec<(usize, f64)> = idx.iter().map(|&i| (i, score(i))).collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    order.into_iter().map(|(i, _)| i).collect()
}

/// The candidate to try next, or `None` when there is none. Untried candidates come first.
pub fn choose(c: &[Candidate<'_>], key: Option<u64>, mode: RoutingMode, rr: u64, load_factor: f64) -> Option<usize> {
    let untried: Vec<usize> = (0..c.len()).filter(|&i| !c[i].tried).collect();
    let idx: Vec<usize> = if untried.is_empty() { (0..c.len()).collect() } else { untried };
    if idx.is_empty() {
        return None;
    }
    match (mode, key) {
        (RoutingMode::RoundRobin, _) => Some(idx[(rr % idx.len() as u64) as usize]),
        (RoutingMode::LeastLoad, _) | (RoutingMode::Prefix, None) => least_load(c, &idx),
        (RoutingMode::Prefix, Some(key)) => {
            let total: u64 = idx.iter().map(|&i| c[i].load()).sum();
            let weights: u64 = idx.iter().map(|&i| u64::from(c[i].weight)).sum();
            rendezvous(c, &idx, key)
                .into_iter()
                .find(|&i| {
                    let share = (total + 1) as f64 * f64::from(c[i].weight) / weights as f64;
                    (c[i].load() + 1) as f64 <= (load_factor * share).ceil().max(1.0)
                })
                .or_else(|| least_load(c, &idx))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(loads: &[u64]) -> Vec<Candidate<'static>> {
        loads
            .iter()
            .enumerate()
            .map(|(i, l)| Candidate {
                name: Box::leak(format!("c{i}").into_boxed_str()),
                weight: 1,
                inflight: *l,
                queue_depth: 0,
                ewma_ms: 0.0,
                tried: false,
            })
            .collect()
    }

    #[test]
    fn the_hash_is_seeded_fnv1a_finalised_as_before() {
        assert_eq!(hash(7, b"prompt"), 0xe95e_8c84_ab29_e642, "every gateway replica and release agrees");
    }

    #[test]
    fn same_prefix_same_cluster_and_prefixes_spread() {
        let c = cands(&[0, 0, 0, 0]);
        let k = prefix_key("You are a helpful assistant. Answer briefly.", 256);
        let first = choose(&c, k, RoutingMode::Prefix, 0, 1.25);
        for _ in 0..5 {
            assert_eq!(choose(&c, k, RoutingMode::Prefix, 0, 1.25), first);
        }
        let picked: std::collections::HashSet<_> = (0..64)
            .map(|i| choose(&c, prefix_key(&format!("system prompt {i}"), 256), RoutingMode::Prefix, 0, 1.25))
            .collect();
        assert!(picked.len() >= 3, "64 prefixes should spread over most of 4 clusters: {picked:?}");
    }

    #[test]
    fn bounded_load_moves_a_hot_prefix_off_an_overloaded_cluster() {
        let k = prefix_key("hot prefix", 256);
        let c = cands(&[0, 0]);
        let home = choose(&c, k, RoutingMode::Prefix, 0, 1.25).unwrap();
        let mut loads = [0u64, 0];
        loads[home] = 10;
        let c = cands(&loads);
        assert_eq!(choose(&c, k, RoutingMode::Prefix, 0, 1.25), Some(1 - home));
    }

    #[test]
    fn untried_first_then_least_load_and_round_robin() {
        let mut c = cands(&[0, 5, 1]);
        c[0].tried = true;
        assert_eq!(choose(&c, None, RoutingMode::LeastLoad, 0, 1.25), Some(2));
        assert_eq!(choose(&c, None, RoutingMode::RoundRobin, 1, 1.25), Some(2));
        assert_eq!(choose(&[], None, RoutingMode::Prefix, 0, 1.25), None);
    }
}
