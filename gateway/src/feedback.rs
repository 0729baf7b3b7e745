//! What the gateway sees, turned into the `Serving` condition of each ModelDeployment. Attempts
//! flow in through [`Stats::record`] (per model and cluster, over a one-minute window of
//! ten-second slots); [`serving`] is the pure decision from the routes, the circuit breakers
//! and that window. Error rates and latency (the bound of the median's histogram bucket) are
//! reported for troubled clusters only, so the condition changes when the service does, not
//! with every request. The writer (in `feed`) writes it from one elected replica, on change.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use flotilla_apis::conditions::{Desired, Status};
use flotilla_apis::constants::{condition, reason};

use crate::health::lock;

/// Upper bounds (ms) of the latency buckets; the last bucket is open.
const BOUNDS_MS: [u64; 12] = [10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000];
const SLOTS: usize = 6;
const SLOT: Duration = Duration::from_secs(10);
/// Below this many attempts in the window an error rate is not judged.
pub const MIN_ATTEMPTS: u64 = 10;

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    epoch: u64,
    ok: u64,
    failed: u64,
    broken: u64,
    hist: [u32; BOUNDS_MS.len() + 1],
}

/// The last minute of attempts of one model on one cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Attempts that succeeded.
    pub ok: u64,
    /// Attempts that failed (connection errors, 5xx, timeouts, streams broken mid-answer; not
    /// 4xx or 429).
    pub failed: u64,
    /// Of those, streams that broke after their first byte (continued elsewhere when possible).
    pub broken: u64,
    /// Upper bound of the bucket holding the median successful latency, in ms (`None`: no
    /// successes, or above the last bound).
    pub p50_le_ms: Option<u64>,
}

impl Observation {
    /// Failed share of attempts, when there were enough to judge.
    pub fn error_rate(&self) -> Option<f64> {
        let n = self.ok + self.failed;
        (n >= MIN_ATTEMPTS).then(|| self.failed as f64 / n as f64)
    }
}

/// Per (model, cluster) windows, keyed model then cluster so that recording an attempt looks
/// its window up by the names it has, allocating only the first time a pair is seen.
#[derive(Debug)]
pub struct Stats {
    base: Instant,
    windows: Mutex<HashMap<String, HashMap<String, [Slot; SLOTS]>>>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats { base: Instant::now(), windows: Mutex::new(HashMap::new()) }
    }
}

impl Stats {
    fn epoch(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base).as_secs() / SLOT.as_secs()
    }

    /// Record one attempt: `latency` is `Some` for a success.
    pub fn record(&self, model: &str, cluster: &str, latency: Option<Duration>, now: Instant) {
        self.slot(model, cluster, now, |slot| match latency {
            Some(d) => {
                slot.ok += 1;
                let ms = d.as_millis() as u64;
                let i = BOUNDS_MS.iter().position(|b| ms <= *b).unwrap_or(BOUNDS_MS.len());
                slot.hist[i] += 1;
            }
            None => slot.failed += 1,
        });
    }

    /// Record a stream that broke after its first byte: a failure of the attempt that began it.
    pub fn record_broken(&self, model: &str, cluster: &str, now: Instant) {
        self.slot(model, cluster, now, |slot| {
            slot.failed += 1;
            slot.broken += 1;
        });
    }

    fn slot(&self, model: &str, cluster: &str, now: Instant, f: impl FnOnce(&mut Slot)) {
        let epoch = self.epoch(now);
        let apply = |slots: &mut [Slot; SLOTS]| {
            let slot = &mut slots[(epoch % SLOTS as u64) as usize];
            if slot.epoch != epoch {
                *slot = Slot { epoch, ..Slot::default() };
            }
            f(slot);
        };
        let mut w = lock(&self.windows);
        // One lookup per level once the pair is known; the names are copied only the first time.
        if let Some(slots) = w.get_mut(model).and_then(|c| c.get_mut(cluster)) {
            apply(slots);
            return;
        }
        let clusters = w.entry(model.to_string()).or_default();
        apply(clusters.entry(cluster.to_string()).or_insert([Slot::default(); SLOTS]));
    }

    /// The window of `model` on `cluster` at `now`.
    pub fn observe(&self, model: &str, cluster: &str, now: Instant) -> Observation {
        let epoch = self.epoch(now);
        let w = lock(&self.windows);
        let Some(slots) = w.get(model).and_then(|c| c.get(cluster)) else { return Observation::default() };
        let mut out = Observation::default();
        let mut hist = [0u64; BOUNDS_MS.len() + 1];
        for s in slots.iter().filter(|s| s.epoch + SLOTS as u64 > epoch && s.epoch <= epoch) {
            out.ok += s.ok;
            out.failed += s.failed;
            out.broken += s.broken;
            for (h, v) in hist.iter_mut().zip(s.hist) {
                *h += u64::from(v);
            }
        }
        let half = out.ok.div_ceil(2);
        let mut seen = 0;
        for (i, n) in hist.iter().enumerate() {
            seen += n;
            if out.ok > 0 && seen >= half {
                out.p50_le_ms = BOUNDS_MS.get(i).copied();
                break;
            }
        }
        out
    }
}

/// One route of a model as the decision sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    /// Cluster name.
    pub cluster: String,
    /// Ready replicas there.
    pub ready: u32,
    /// The gateway's circuit breaker has ejected the cluster.
    pub ejected: bool,
    /// The last minute.
    pub seen: Observation,
}

/// The `Serving` condition of `model` from its routes (`endpoints`, sorted by cluster).
/// `degraded_at` is the error rate from which a cluster counts as degraded.
pub fn serving(model: &str, endpoints: &[Endpoint], degraded_at: f64) -> Desired {
    if endpoints.is_empty() {
        return Desired::new(
            condition::SERVING,
            Status::False,
            reason::NO_READY_ENDPOINTS,
            format!(
                "the gateway has no cluster with a Ready replica of `{model}` on a Ready InferenceCluster with an http endpoint: requests get 503; see the Ready and Placed conditions"
            ),
        );
    }
    let mut healthy = Vec::new();
    let mut troubled = Vec::new();
    for e in endpoints {
        let rate = e.seen.error_rate().filter(|r| *r >= degraded_at);
        let latency = e.seen.p50_le_ms.map(|b| format!(", p50 ≤ {b} ms")).unwrap_or_default();
        if e.ejected {
            troubled.push(format!("{} ejected (its circuit is open after consecutive failures)", e.cluster));
        } else if let Some(r) = rate {
            let broken = match e.seen.broken {
                0 => String::new(),
                1 => " (1 stream broke mid-answer)".to_string(),
                n => format!(" ({n} streams broke mid-answer)"),
            };
            troubled.push(format!(
                "{} failing {:.0}% of attempts over the last minute{broken}{latency}",
                e.cluster,
                r * 100.0
            ));
        } else {
            // Healthy clusters carry no numbers, so a quiet or steady fleet writes nothing.
            healthy.push(format!("{} ({} ready)", e.cluster, e.ready));
        }
    }
    let all_ejected = endpoints.iter().all(|e| e.ejected);
    if all_ejected {
        return Desired::new(
            condition::SERVING,
            Status::False,
            reason::ALL_ENDPOINTS_EJECTED,
            format!(
                "every cluster serving `{model}` is ejected: {}; requests get 503 until a probe succeeds: check the engines on those clusters",
                troubled.join("; ")
            ),
        );
    }
    if !troubled.is_empty() {
        let through = if healthy.is_empty() { "no healthy cluster".to_string() } else { healthy.join(", ") };
        return Desired::new(
            condition::SERVING,
            Status::True,
            reason::SERVING_DEGRADED,
            format!(
                "serving `{model}` through {through}; {}: traffic avoids them, check their engines",
                troubled.join("; ")
            ),
        );
    }
    Desired::new(
        condition::SERVING,
        Status::True,
        reason::ROUTABLE,
        format!("serving `{model}` through {}", healthy.join(", ")),
    )
}

/// `base` (the deployment's own `Serving`) with what its LoRA adapters' routes show: an adapter
/// failing on a cluster (error rate at or above `degraded_at`) or ejected there makes a
/// `Routable` deployment `Degraded` (still serving), the message naming the adapter and the
/// cluster, so that requests failing for an adapter never hide behind a healthy base model.
/// `adapters` are (name, its routes) in spec order; an adapter without routes adds nothing
/// here (`status.adapters` says why it is served nowhere yet).
pub fn with_adapters(mut base: Desired, adapters: &[(String, Vec<Endpoint>)], degraded_at: f64) -> Desired {
    let mut troubled = Vec::new();
    for (name, endpoints) in adapters {
        for e in endpoints {
            if e.ejected {
                troubled.push(format!("adapter `{name}` ejected on {} (its circuit is open)", e.cluster));
            } else if let Some(r) = e.seen.error_rate().filter(|r| *r >= degraded_at) {
                troubled.push(format!(
                    "adapter `{name}` failing {:.0}% of attempts on {} over the last minute",
                    r * 100.0,
                    e.cluster
                ));
            }
        }
    }
    if troubled.is_empty() {
        return base;
    }
    if base.status == Status::True && base.reason == reason::ROUTABLE {
        base.reason = reason::SERVING_DEGRADED;
    }
    base.message.push_str(&format!("; {}: check the adapters' loads on those clusters", troubled.join("; ")));
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(cluster: &str, ejected: bool, seen: Observation) -> Endpoint {
        Endpoint { cluster: cluster.into(), ready: 2, ejected, seen }
    }

    #[test]
    fn windows_forget_after_a_minute_and_bucket_latency() {
        let s = Stats::default();
        let t = s.base;
        for _ in 0..9 {
            s.record("m", "eu1", Some(Duration::from_millis(40)), t);
        }
        s.record("m", "eu1", None, t + Duration::from_secs(15));
        let o = s.observe("m", "eu1", t + Duration::from_secs(20));
        assert_eq!((o.ok, o.failed, o.p50_le_ms), (9, 1, Some(50)));
        assert_eq!(o.error_rate(), Some(0.1));
        assert_eq!(s.observe("m", "eu2", t), Observation::default(), "other clusters are separate");
        let later = s.observe("m", "eu1", t + Duration::from_secs(61));
        assert_eq!((later.ok, later.failed), (0, 1), "the first slot has aged out, the second not yet");
        assert_eq!(s.observe("m", "eu1", t + Duration::from_secs(90)), Observation::default());
    }

    #[test]
    fn the_condition_names_what_is_wrong() {
        let quiet = Observation::default();
        let bad = Observation { ok: 8, failed: 4, broken: 0, p50_le_ms: Some(100) };
        let none = serving("m", &[], 0.05);
        assert_eq!((none.status, none.reason), (Status::False, reason::NO_READY_ENDPOINTS));
        let ok = serving("m", &[ep("eu1", false, quiet), ep("eu2", false, quiet)], 0.05);
        assert_eq!((ok.status, ok.reason), (Status::True, reason::ROUTABLE));
        assert_eq!(ok.message, "serving `m` through eu1 (2 ready), eu2 (2 ready)");
        let one = serving("m", &[ep("eu1", true, quiet), ep("eu2", false, bad)], 0.05);
        assert_eq!((one.status, one.reason), (Status::True, reason::SERVING_DEGRADED));
        assert!(one.message.contains("eu1 ejected") && one.message.contains("eu2 failing 33%"), "{}", one.message);
        let all = serving("m", &[ep("eu1", true, quiet), ep("eu2", true, bad)], 0.05);
        assert_eq!((all.status, all.reason), (Status::False, reason::ALL_ENDPOINTS_EJECTED));
        // A small error rate, or too few attempts to judge, is not degraded.
        let few = Observation { ok: 2, failed: 1, broken: 1, p50_le_ms: Some(10) };
        assert_eq!(serving("m", &[ep("eu1", false, few)], 0.05).reason, reason::ROUTABLE);
        // Streams broken mid-answer count as failures, and the message says so.
        let s = Stats::default();
        for _ in 0..8 {
            s.record("m", "eu2", Some(Duration::from_millis(40)), s.base);
        }
        for _ in 0..2 {
            s.record_broken("m", "eu2", s.base);
        }
        let seen = s.observe("m", "eu2", s.base);
        assert_eq!((seen.ok, seen.failed, seen.broken), (8, 2, 2));
        let d = serving("m", &[ep("eu1", false, quiet), ep("eu2", false, seen)], 0.05);
        assert_eq!(d.reason, reason::SERVING_DEGRADED);
        assert!(
            d.message.contains("eu2 failing 20% of attempts over the last minute (2 streams broke mid-answer)"),
            "{}",
            d.message
        );
    }

    #[test]
    fn a_failing_adapter_degrades_a_routable_deployment_and_is_named() {
        let healthy = Observation { ok: 50, ..Observation::default() };
        let failing = Observation { ok: 2, failed: 18, ..Observation::default() };
        let base = serving("llama", &[ep("eu1", false, healthy)], 0.2);
        assert_eq!(base.reason, reason::ROUTABLE);
        let fine = vec![("support-fr".to_string(), vec![ep("eu1", false, healthy)]), ("none".to_string(), vec![])];
        assert_eq!(with_adapters(base.clone(), &fine, 0.2), base, "healthy adapters change nothing");
        let broken = vec![("support-fr".to_string(), vec![ep("eu1", false, failing)])];
        let got = with_adapters(base.clone(), &broken, 0.2);
        assert_eq!((got.status, got.reason), (Status::True, reason::SERVING_DEGRADED));
        assert!(got.message.contains("adapter `support-fr` failing 90% of attempts on eu1"), "{}", got.message);
        let ejected = vec![("sql".to_string(), vec![ep("us1", true, healthy)])];
        assert!(with_adapters(base, &ejected, 0.2).message.contains("adapter `sql` ejected on us1"));
        // A deployment with no ready endpoint keeps its own reason; the adapter is still named.
        let down = serving("llama", &[], 0.2);
        let got = with_adapters(down, &broken, 0.2);
        assert_eq!((got.status, got.reason), (Status::False, reason::NO_READY_ENDPOINTS));
        assert!(got.message.contains("support-fr"));
    }
}
