//! The per-(deployment, cluster) filters that do not depend on capacity: cluster selector,
//! sovereignty, readiness and cordon, taints. Each returns a verdict; the first failure is the
//! reason a cluster gives for taking nothing.

use std::collections::BTreeMap;

use flotilla_apis::common::TaintEffect;
use flotilla_apis::deployment::PlacementPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::plan::{Reason, Verdict};
use crate::snapshot::ClusterView;

/// Builds verdicts, formatting details only when asked: the hot path of a solve needs the
/// reasons, not the words (those are produced again for what is reported).
struct Verdicts {
    detail: bool,
    /// Words for passing filters too (explain); a refusal's words need only the failure's.
    pass_detail: bool,
}

impl Verdicts {
    fn pass<S: Into<String>>(&self, filter: &'static str, detail: impl FnOnce() -> S) -> Verdict {
        let detail = if self.detail && self.pass_detail { detail().into() } else { String::new() };
        Verdict { filter, pass: true, reason: None, detail }
    }

    fn fail<S: Into<String>>(&self, filter: &'static str, reason: Reason, detail: impl FnOnce() -> S) -> Verdict {
        Verdict {
            filter,
            pass: false,
            reason: Some(reason),
            detail: if self.detail { detail().into() } else { String::new() },
        }
    }
}

pub use flotilla_apis::selector::selector_matches;

/// Whether `labels` match a label selector (no message: the fast path).
fn selector_ok(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && selector.match_expressions.iter().flatten().all(|e| {
            let have = labels.get(&e.key);
            let values = e.values.as_deref().unwrap_or(&[]);
            match e.operator.as_str() {
                "In" => have.is_some_and(|h| values.contains(h)),
                "NotIn" => !have.is_some_and(|h| values.contains(h)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            }
        })
}

/// Applies the static filters in order and returns every verdict up to and including the first
/// failure. `sticky` is true when the deployment already runs here: a cordon keeps existing
/// replicas, a `NoExecute` taint does not. With `detail` false the verdicts carry reasons but
/// no words.
pub fn static_verdicts(policy: &PlacementPolicy, cluster: &ClusterView, sticky: bool, detail: bool) -> Vec<Verdict> {
    let mut out = Vec::with_capacity(5);
    static_check(policy, cluster, sticky, Verdicts { detail, pass_detail: true }, |v| {
        let ok = v.pass;
        out.push(v);
        ok
    });
    out
}

/// The first static filter that refuses the cluster, if any; allocation-free (the solver's
/// hot path).
pub fn first_refusal(policy: &PlacementPolicy, cluster: &ClusterView, sticky: bool) -> Option<Reason> {
    let mut refusal = None;
    static_check(policy, cluster, sticky, Verdicts { detail: false, pass_detail: false }, |v| {
        refusal = v.reason;
        v.pass
    });
    refusal
}

/// Runs the filters in order, handing each verdict to `push` until it returns false.
fn static_check(
    policy: &PlacementPolicy,
    cluster: &ClusterView,
    sticky: bool,
    vb: Verdicts,
    mut push: impl FnMut(Verdict) -> bool,
) {
    let sel = match &policy.cluster_selector {
        None => vb.pass("selector", || "no cluster selector"),
        Some(s) if selector_ok(s, &cluster.labels) => vb.pass("selector", || "labels match"),
        Some(s) => vb.fail("selector", Reason::ClusterSelectorMismatch, || {
            selector_matches(s, &cluster.labels).err().unwrap_or_else(|| "labels do not match".into())
        }),
    };
    if !push(sel) {
        return;
    }
    let sov = match &policy.sovereignty {
        None => vb.pass("sovereignty", || "no sovereignty policy"),
        Some(s) => {
            let j = &cluster.jurisdiction;
            if !s.allowed_jurisdictions.is_empty() && !s.allowed_jurisdictions.iter().any(|a| a.as_str() == j) {
                vb.fail("sovereignty", Reason::JurisdictionNotAllowed, || {
                    let allowed: Vec<_> = s.allowed_jurisdictions.iter().map(|a| a.as_str()).collect();
                    format!("jurisdiction {j} not in allowed [{}]", allowed.join(", "))
                })
            } else if !s.allowed_regions.is_empty() && !s.allowed_regions.contains(&cluster.region) {
                vb.fail("sovereignty", Reason::RegionNotAllowed, || {
                    format!("region {} not in allowed [{}]", cluster.region, s.allowed_regions.join(", "))
                })
            } else if s.denied_regions.contains(&cluster.region) {
                vb.fail("sovereignty", Reason::RegionDenied, || format!("region {} is denied", cluster.region))
            } else {
                vb.pass("sovereignty", || format!("jurisdiction {j}, region {} allowed", cluster.region))
            }
        }
    };
    if !push(sov) {
        return;
    }
    let ready = if !cluster.ready {
        vb.fail("readiness", Reason::ClusterNotReady, || {
            format!("cluster is not Ready ({})", cluster.not_ready_reason.as_deref().unwrap_or("unknown"))
        })
    } else if cluster.cordoned && !sticky {
        vb.fail("readiness", Reason::ClusterCordoned, || "cluster is cordoned: no new replicas")
    } else {
        vb.pass("readiness", || if cluster.cordoned { "cordoned, but already runs here" } else { "Ready" })
    };
    if !push(ready) {
        return;
    }
    let untolerated = cluster.taints.iter().find(|t| {
        let blocking = match t.effect {
            TaintEffect::NoSchedule => !sticky,
            TaintEffect::NoExecute => true,
            TaintEffect::PreferNoSchedule => false,
        };
        blocking && !policy.tolerations.iter().any(|tol| tol.tolerates(t))
    });
    let taints = match untolerated {
        Some(t) => vb.fail("taints", Reason::TaintNotTolerated, || {
            format!("taint {}={}:{:?} is not tolerated", t.key, t.value.as_deref().unwrap_or(""), t.effect)
        }),
        None => vb.pass("taints", || if cluster.taints.is_empty() { "no taints" } else { "all taints tolerated" }),
    };
    push(taints);
}

/// Whether a cluster has a `PreferNoSchedule` taint the policy does not tolerate.
pub fn prefers_not(policy: &PlacementPolicy, cluster: &ClusterView) -> bool {
    cluster
        .taints
        .iter()
        .any(|t| t.effect == TaintEffect::PreferNoSchedule && !policy.tolerations.iter().any(|tol| tol.tolerates(t)))
}

/// The static filters of one solve, memoized per distinct placement policy: fleets repeat a
/// handful of (selector, sovereignty, tolerations) policies over thousands of deployments, and
/// without the memo every deployment judged every cluster again (5 M judgements at 1,000
/// clusters × 5,000 deployments). Rows are for a deployment that does not run on the cluster
/// (`sticky` false); where it runs, a cordon or a `NoSchedule` taint judges differently, and
/// callers ask [`first_refusal`] directly (a deployment runs on a few clusters).
#[derive(Default)]
pub struct StaticMemo {
    rows: std::collections::HashMap<String, std::sync::Arc<Row>>,
}

/// One policy's verdicts over every cluster of the snapshot, by cluster index.
pub struct Row {
    refusals: Vec<Option<Reason>>,
    /// The words of a refusal, said once per (policy, cluster) and only for what is reported;
    /// allocated on first use (most policies never report a refusal, and a fleet may have as many
    /// policies as deployments).
    words: std::sync::OnceLock<Vec<std::sync::OnceLock<String>>>,
}

impl Row {
    /// The first static filter that refuses cluster `ci` to a deployment not running there.
    pub fn refusal(&self, ci: usize) -> Option<Reason> {
        self.refusals.get(ci).copied().flatten()
    }

    /// The words of that refusal (as [`static_verdicts`] says them), computed once.
    pub fn words(&self, ci: usize, policy: &PlacementPolicy, cluster: &ClusterView) -> String {
        let words = self.words.get_or_init(|| (0..self.refusals.len()).map(|_| std::sync::OnceLock::new()).collect());
        let Some(slot) = words.get(ci) else {
            return refusal_words(policy, cluster, false);
        };
        slot.get_or_init(|| refusal_words(policy, cluster, false)).clone()
    }
}

/// The words of the first static refusal of `cluster` (empty when it passes).
pub fn refusal_words(policy: &PlacementPolicy, cluster: &ClusterView, sticky: bool) -> String {
    let mut words = String::new();
    // Only the failing filter's words are said: the passing ones' would be thrown away.
    static_check(policy, cluster, sticky, Verdicts { detail: true, pass_detail: false }, |v| {
        if !v.pass {
            words = v.detail;
        }
        v.pass
    });
    words
}

impl StaticMemo {
    /// Policies judged.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no policy was judged yet.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The verdicts of `policy` over `clusters`, judged on first use.
    pub fn row(&mut self, policy: &PlacementPolicy, clusters: &[ClusterView]) -> std::sync::Arc<Row> {
        // Exactly the fields `static_check` reads (Debug is deterministic for these types).
        let key = format!("{:?}\u{0}{:?}\u{0}{:?}", policy.cluster_selector, policy.sovereignty, policy.tolerations);
        self.rows
            .entry(key)
            .or_insert_with(|| {
                std::sync::Arc::new(Row {
                    refusals: clusters.iter().map(|c| first_refusal(policy, c, false)).collect(),
                    words: std::sync::OnceLock::new(),
                })
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use flotilla_apis::common::{JurisdictionCode, Sovereignty};

    use super::*;

    fn cluster(name: &str, jurisdiction: &str) -> ClusterView {
        ClusterView { name: name.into(), jurisdiction: jurisdiction.into(), ready: true, ..Default::default() }
    }

    fn eu_only() -> PlacementPolicy {
        let sovereignty =
            Sovereignty { allowed_jurisdictions: vec![JurisdictionCode("EU".into())], ..Default::default() };
        PlacementPolicy { sovereignty: Some(sovereignty), ..Default::default() }
    }

    #[test]
    fn the_memo_judges_each_policy_once_and_says_words_only_when_asked() {
        let clusters = [cluster("fra", "EU"), cluster("iad", "US")];
        let mut memo = StaticMemo::default();
        let row = memo.row(&eu_only(), &clusters);
        assert_eq!(row.refusal(0), None);
        assert_eq!(row.refusal(1), Some(Reason::JurisdictionNotAllowed));
        // An equal policy (another deployment's) gets the same row; another policy its own.
        assert!(std::sync::Arc::ptr_eq(&row, &memo.row(&eu_only(), &clusters)));
        let open = memo.row(&PlacementPolicy::default(), &clusters);
        assert!(!std::sync::Arc::ptr_eq(&row, &open));
        assert_eq!(open.refusal(1), None, "no sovereignty: the US cluster passes");
        // No words are held until a refusal is reported: a row costs a byte per cluster.
        assert!(row.words.get().is_none());
        let words = row.words(1, &eu_only(), &clusters[1]);
        assert_eq!(words, refusal_words(&eu_only(), &clusters[1], false));
        assert!(words.contains("jurisdiction US not in allowed [EU]"), "{words}");
        assert_eq!(row.words.get().map(Vec::len), Some(clusters.len()));
    }
}
