//! The PodDisruptionBudget of one pool's share of a deployment in one member, from
//! `spec.disruptionBudget` (default `maxUnavailable: 1`). Its selector is exactly the pool's
//! pods (the labels every pod of that pool carries, whatever its role), so each Flotilla pod is
//! in exactly one budget: the eviction API refuses pods that two budgets select. Where a
//! replica is one pod, the budget is passed through as written and Kubernetes counts it
//! against the workload's scale. Where a replica is several pods (a LeaderWorkerSet group, a
//! disaggregated prefill/decode set), evicting any one pod takes its whole replica down, so the
//! budget is resolved here into replicas (percentages rounded up, as Kubernetes rounds a
//! budget's percentage) and written as `maxUnavailable` in pods: N evictions break at most N
//! replicas. Pods that are not ready may always be evicted (`unhealthyPodEvictionPolicy:
//! AlwaysAllow`), so a broken replica never blocks a drain. Pure.

use flotilla_apis::ModelDeployment;
use flotilla_apis::deployment::{Budget, DisruptionBudget, ReplicaCount, TopologyType};
use serde_json::{Value, json};

/// Pods in one whole replica of `md` (one pod per node of a LeaderWorkerSet group, every role's
/// pods of a disaggregated replica, else 1).
pub fn pods_per_replica(md: &ModelDeployment) -> u32 {
    let t = &md.spec.topology;
    match t.type_ {
        TopologyType::MultiNode => t.nodes_per_replica.unwrap_or(1).max(1),
        TopologyType::Disaggregated => t.roles.iter().map(|r| r.pods).sum::<u32>().max(1),
        TopologyType::Standalone | TopologyType::TensorParallel => 1,
    }
}

/// `percent` of `replicas`, rounded up (as the disruption controller rounds).
fn share(percent: u32, replicas: i32) -> i32 {
    let r = i64::from(replicas.max(0));
    i32::try_from((r * i64::from(percent) + 99) / 100).unwrap_or(i32::MAX)
}

fn count(c: &ReplicaCount, replicas: i32) -> i32 {
    match c {
        ReplicaCount::Count(n) => (*n).max(0),
        ReplicaCount::Percent(_) => share(c.percent().unwrap_or(100), replicas),
    }
}

fn as_json(c: &ReplicaCount) -> Value {
    match c {
        ReplicaCount::Count(n) => json!(n),
        ReplicaCount::Percent(p) => json!(p),
    }
}

/// The budget's field and value for a pool running `replicas` replicas of `pods` pods each:
/// `("maxUnavailable", 1)`, `("minAvailable", "50%")`, ...
pub fn budget_field(budget: &Budget, pods: u32, replicas: i32) -> (&'static str, Value) {
    if pods <= 1 {
        return match budget {
            Budget::MaxUnavailable(c) => ("maxUnavailable", as_json(c)),
            Budget::MinAvailable(c) => ("minAvailable", as_json(c)),
        };
    }
    // Replicas that may be down, then one pod each: any evicted pod may be of another replica.
    let down = match budget {
        Budget::MaxUnavailable(c) => count(c, replicas),
        Budget::MinAvailable(c) => replicas.max(0) - count(c, replicas).min(replicas.max(0)),
    };
    ("maxUnavailable", json!(down.clamp(0, replicas.max(0))))
}

/// The PodDisruptionBudget for `pool` (`replicas` replicas there), named like the pool's
/// workload (`<deployment>-<pool>`), selecting the pool's pods by `pod_labels`.
pub fn pdb(
    md: &ModelDeployment,
    name: &str,
    namespace: &str,
    labels: &std::collections::BTreeMap<String, String>,
    pod_labels: &std::collections::BTreeMap<String, String>,
    replicas: i32,
) -> Value {
    let budget = DisruptionBudget::budget(md.spec.disruption_budget.as_ref());
    let (field, value) = budget_field(&budget, pods_per_replica(md), replicas);
    let mut spec = json!({
        "selector": {"matchLabels": pod_labels},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    });
    spec[field] = value;
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max(c: ReplicaCount) -> Budget {
        Budget::MaxUnavailable(c)
    }
    fn min(c: ReplicaCount) -> Budget {
        Budget::MinAvailable(c)
    }
    use ReplicaCount::{Count, Percent};

    #[test]
    fn one_pod_replicas_pass_the_budget_through() {
        assert_eq!(budget_field(&max(Count(1)), 1, 4), ("maxUnavailable", json!(1)));
        assert_eq!(budget_field(&max(Percent("25%".into())), 1, 4), ("maxUnavailable", json!("25%")));
        assert_eq!(budget_field(&min(Count(2)), 1, 4), ("minAvailable", json!(2)));
        assert_eq!(budget_field(&min(Percent("50%".into())), 1, 4), ("minAvailable", json!("50%")));
        // One replica on a cluster, default budget: its drain may proceed (the fleet's other
        // clusters carry the model meanwhile); blocking is asked for with minAvailable.
        assert_eq!(budget_field(&max(Count(1)), 1, 1), ("maxUnavailable", json!(1)));
    }

    #[test]
    fn multi_pod_replicas_count_one_pod_per_replica_that_may_break() {
        // 3 groups of 4 pods: at most 1 group down means at most 1 pod evicted at a time.
        assert_eq!(budget_field(&max(Count(1)), 4, 3), ("maxUnavailable", json!(1)));
        assert_eq!(budget_field(&max(Count(2)), 4, 3), ("maxUnavailable", json!(2)));
        // Percentages of replicas, rounded up: 25% of 3 is 1, 50% of 3 is 2, 0% is 0.
        assert_eq!(budget_field(&max(Percent("25%".into())), 4, 3), ("maxUnavailable", json!(1)));
        assert_eq!(budget_field(&max(Percent("50%".into())), 4, 3), ("maxUnavailable", json!(2)));
        assert_eq!(budget_field(&max(Percent("0%".into())), 4, 3), ("maxUnavailable", json!(0)));
        // minAvailable: what may be down is the rest.
        assert_eq!(budget_field(&min(Count(2)), 4, 3), ("maxUnavailable", json!(1)));
        assert_eq!(budget_field(&min(Count(5)), 4, 3), ("maxUnavailable", json!(0)), "more than run: nothing may go");
        assert_eq!(budget_field(&min(Percent("50%".into())), 2, 3), ("maxUnavailable", json!(1)), "3 - ceil(1.5)");
        assert_eq!(budget_field(&min(Percent("100%".into())), 2, 3), ("maxUnavailable", json!(0)));
        // Never more than the replicas there.
        assert_eq!(budget_field(&max(Count(9)), 2, 3), ("maxUnavailable", json!(3)));
        assert_eq!(budget_field(&max(Count(1)), 2, 0), ("maxUnavailable", json!(0)));
    }

    #[test]
    fn the_default_is_max_unavailable_one() {
        assert_eq!(DisruptionBudget::budget(None), max(Count(1)));
        assert_eq!(DisruptionBudget::budget(Some(&DisruptionBudget::default())), max(Count(1)));
        let b = DisruptionBudget { min_available: Some(Count(2)), max_unavailable: None };
        assert_eq!(DisruptionBudget::budget(Some(&b)), min(Count(2)));
    }
}
