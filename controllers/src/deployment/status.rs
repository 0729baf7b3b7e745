//! The status a ModelDeployment should have, from the plan and from what members report. Ready
//! counts come only from member workloads' ready replicas of the current spec
//! (`members/readiness.rs`): a rollout in progress is not Ready on the old spec; 1 of 8 ready
//! is `Degraded`, never `Ready`. `serving` counts ready replicas of any spec. Pure, so that a reconcile that learns nothing new writes nothing.

use std::collections::BTreeMap;

use flotilla_apis::conditions::{Desired, Status, merge};
use flotilla_apis::constants::{condition, reason};
use flotilla_apis::deployment::{ClusterPlacement, ClusterRejection, ModelDeploymentStatus, RefusedPool, Unplaced};
use flotilla_placement::plan::{DeploymentPlan, InvalidSpec, Reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::rollout::{Key, Running};

/// At most this many per-cluster reasons are written to status.
pub const MAX_REASONS: usize = 16;

/// What the reconcile learned, besides the plan.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Per (cluster, pool): replicas asked for and ready, for members that answered.
    pub running: BTreeMap<Key, Running>,
    /// Members that could not be observed or written, with why.
    pub unreachable: BTreeMap<String, String>,
    /// Clusters in the old placements whose InferenceCluster no longer exists.
    pub vanished: std::collections::BTreeSet<String>,
    /// Per (cluster, pool): replicas whose pods the member's scheduler refused.
    pub refused: BTreeMap<Key, super::decide::Refusal>,
    /// Members where applying failed, with why.
    pub apply_failed: BTreeMap<String, String>,
    /// Members where objects were left alone because someone else's object holds their name,
    /// naming them.
    pub name_conflicts: BTreeMap<String, String>,
    /// The CapacityClaim the deployment owns, asking a provider for what does not fit.
    pub claim: Option<String>,
    /// The ModelCache the deployment references, if any, and where replicas wait for it.
    pub cache: Option<CacheWait>,
}

/// Replicas waiting for the deployment's ModelCache.
#[derive(Clone, Debug, Default)]
pub struct CacheWait {
    /// `namespace/name` of the cache.
    pub cache: String,
    /// Cluster → the cache's phase there (`Downloading`, `Failed (DigestMismatch)`, …), for the
    /// clusters where replicas are held back.
    pub waiting: BTreeMap<String, String>,
}

/// `WaitingForCache`, when the deployment references a cache (or did before).
fn cache_condition(previous: &ModelDeploymentStatus, observed: &Observed) -> Option<Desired> {
    match &observed.cache {
        Some(w) if !w.waiting.is_empty() => {
            let where_: Vec<String> = w.waiting.iter().map(|(c, p)| format!("{c} ({p})")).collect();
            Some(Desired::new(
                condition::WAITING_FOR_CACHE,
                Status::True,
                reason::CACHE_NOT_READY,
                format!("replicas wait for ModelCache {} to be Ready in {}", w.cache, where_.join(", ")),
            ))
        }
        Some(w) => Some(Desired::new(
            condition::WAITING_FOR_CACHE,
            Status::False,
            reason::AS_EXPECTED,
            format!("ModelCache {} is Ready wherever replicas start", w.cache),
        )),
        None => previous
            .conditions
            .get(condition::WAITING_FOR_CACHE)
            .map(|_| Desired::new(condition::WAITING_FOR_CACHE, Status::False, reason::AS_EXPECTED, "no cacheRef")),
    }
}

fn placed_message(plan: &DeploymentPlan) -> String {
    let placed = plan.desired - plan.unplaced;
    let mut msg = format!("{placed} of {} replicas placed", plan.desired);
    let reasons: Vec<String> =
        plan.rejections.iter().take(6).map(|r| format!("{}: {}", r.cluster, r.message)).collect();
    if !reasons.is_empty() {
        msg.push_str("; ");
        msg.push_str(&reasons.join("; "));
    }
    for m in &plan.unmet_minimums {
        msg.push_str(&format!("; alternative {} wants at least {}, got {}", m.rank, m.wanted, m.placed));
    }
    msg
}

/// The next status. `previous` supplies condition transition times.
pub fn desired(
    previous: Option<&ModelDeploymentStatus>,
    generation: Option<i64>,
    plan: &DeploymentPlan,
    observed: &Observed,
    now: &Time,
    backoff: std::time::Duration,
) -> ModelDeploymentStatus {
    let old = previous.cloned().unwrap_or_default();
    let mut placements: Vec<ClusterPlacement> = plan
        .assignments
        .iter()
        .map(|a| {
            let key = (a.cluster.clone(), a.pool.clone());
            let r = observed.running.get(&key).copied().unwrap_or_default();
            // Refused replicas the plan still wants here. A scale-down removes pods that are on
            // no node first, so the replicas it removes are not among them.
            let refused = observed.refused.get(&key).map_or(0, |f| f.replicas);
            let wanted = a.replicas as i32;
            let unschedulable = (refused - (r.applied - wanted).max(0)).clamp(0, wanted);
            ClusterPlacement { serving: r.ready, unschedulable, ..a.to_placement(r.current) }
        })
        .collect();
    // Replicas still running where the plan no longer wants them (draining, make-before-break).
    for ((cluster, pool), r) in &observed.running {
        if r.applied > 0 && !placements.iter().any(|p| p.cluster == *cluster && p.pool == *pool) {
            let prev = old.placements.iter().find(|p| p.cluster == *cluster && p.pool == *pool);
            placements.push(ClusterPlacement {
                cluster: cluster.clone(),
                pool: pool.clone(),
                class: prev.map(|p| p.class.clone()).unwrap_or_default(),
                capacity_type: prev.map_or(flotilla_apis::CapacityType::OnDemand, |p| p.capacity_type),
                fallback_rank: prev.map_or(1, |p| p.fallback_rank),
                desired: 0,
                ready: r.current,
                serving: r.ready,
                // Still said while its pods wait: the pool takes no new replicas meanwhile.
                unschedulable: observed.refused.get(&(cluster.clone(), pool.clone())).map_or(0, |f| f.replicas),
            });
        }
    }
    // A member that could not be observed keeps its placements (ready 0: not evidence now):
    // status placements are where this deployment's objects may be, which the next reconcile
    // prunes and the deletion cleans. Dropping them while the member is down would let a
    // deletion forget the objects still there.
    for p in &old.placements {
        let unseen = observed.unreachable.contains_key(&p.cluster) && !observed.vanished.contains(&p.cluster);
        if unseen && !placements.iter().any(|q| q.cluster == p.cluster && q.pool == p.pool) {
            placements.push(ClusterPlacement { desired: 0, ready: 0, ..p.clone() });
        }
    }
    placements.sort_by(|a, b| a.cluster.cmp(&b.cluster).then(a.pool.cmp(&b.pool)));
    let desired_total = plan.desired as i32;
    let ready: i32 = placements.iter().map(|p| p.ready).sum::<i32>().min(desired_total.max(0));
    let fully_placed = plan.unplaced == 0 && plan.unmet_minimums.is_empty();

    let placed_cond = if fully_placed {
        let fallback = plan.assignments.iter().any(|a| a.fallback_rank > 1);
        Desired::new(
            condition::PLACED,
            Status::True,
            if fallback { reason::FALLBACK_SELECTED } else { reason::PLACED },
            placed_message(plan),
        )
    } else {
        let eligible = plan.rejections.iter().any(|r| !r.reason.is_static());
        let why = if observed.claim.is_some() {
            reason::CLAIM_PENDING
        } else if plan.rejections.iter().any(|r| r.reason == Reason::CostCeilingExceeded) {
            reason::COST_CEILING_EXCEEDED
        } else if eligible || plan.desired > plan.unplaced {
            reason::INSUFFICIENT_CAPACITY
        } else {
            reason::NO_ELIGIBLE_CLUSTER
        };
        let mut message = placed_message(plan);
        if let Some(claim) = &observed.claim {
            message.push_str(&format!(
                "; CapacityClaim {claim} asks a provider for the missing capacity (see its Fulfilled condition)"
            ));
        }
        Desired::new(condition::PLACED, Status::False, why, message)
    };
    let capacity = if fully_placed {
        Desired::new(
            condition::CAPACITY_AVAILABLE,
            Status::True,
            reason::AS_EXPECTED,
            "the fleet has room for every replica",
        )
    } else {
        // Every replica placed but a `minReplicas` unmet: say which, not "0 replicas".
        let mut short: Vec<String> = Vec::new();
        if plan.unplaced > 0 {
            short.push(format!("{} replica(s) need capacity the fleet does not have", plan.unplaced));
        }
        short.extend(plan.unmet_minimums.iter().map(|m| {
            format!(
                "alternative {} wants at least {} replica(s) and only {} could be placed on it",
                m.rank, m.wanted, m.placed
            )
        }));
        Desired::new(condition::CAPACITY_AVAILABLE, Status::False, reason::INSUFFICIENT_CAPACITY, short.join("; "))
    };
    let mut problems: Vec<String> = observed.unreachable.iter().map(|(c, m)| format!("{c}: {m}")).collect();
    problems.extend(observed.apply_failed.iter().map(|(c, m)| format!("{c}: apply failed: {m}")));
    let tail = if problems.is_empty() { String::new() } else { format!("; {}", problems.join("; ")) };
    let conflicts: Vec<String> = observed.name_conflicts.iter().map(|(c, m)| format!("{c}: {m}")).collect();
    let conflict_message = format!(
        "{ready}/{desired_total} replicas ready; names taken by objects that are not this deployment's: {}; rename the \
         ModelDeployment or the other object{tail}",
        conflicts.join("; ")
    );
    let ready_cond = if !conflicts.is_empty() {
        // A Service or workload that is someone else's is not serving this model: not Ready.
        Desired::new(condition::READY, Status::False, reason::NAME_CONFLICT, conflict_message.clone())
    } else if desired_total > 0 && ready >= desired_total {
        Desired::new(
            condition::READY,
            Status::True,
            reason::ALL_REPLICAS_READY,
            format!("{ready}/{desired_total} replicas ready"),
        )
    } else if desired_total == 0 {
        Desired::new(condition::READY, Status::True, reason::AS_EXPECTED, "scaled to zero")
    } else if ready == 0 {
        Desired::new(
            condition::READY,
            Status::False,
            reason::NO_REPLICAS_READY,
            format!("0/{desired_total} replicas ready{tail}"),
        )
    } else {
        Desired::new(
            condition::READY,
            Status::False,
            reason::REPLICAS_NOT_READY,
            format!("{ready}/{desired_total} replicas ready{tail}"),
        )
    };
    let degraded = if !conflicts.is_empty() {
        Desired::new(condition::DEGRADED, Status::True, reason::NAME_CONFLICT, conflict_message)
    } else if ready > 0 && ready < desired_total {
        Desired::new(
            condition::DEGRADED,
            Status::True,
            reason::REPLICAS_NOT_READY,
            format!("{ready}/{desired_total} replicas ready{tail}"),
        )
    } else if !observed.apply_failed.is_empty() {
        Desired::new(condition::DEGRADED, Status::True, reason::APPLY_FAILED, problems.join("; "))
    } else {
        Desired::new(
            condition::DEGRADED,
            Status::False,
            reason::AS_EXPECTED,
            format!("{ready}/{desired_total} replicas ready"),
        )
    };
    let mut conds = vec![placed_cond, capacity, ready_cond, degraded];
    conds.extend(cache_condition(&old, observed));
    // Bounded: a fleet of thousands of clusters must not make a status of megabytes.
    let mut reasons: Vec<ClusterRejection> = plan
        .rejections
        .iter()
        .take(MAX_REASONS)
        .map(|r| ClusterRejection {
            cluster: r.cluster.clone(),
            reason: r.reason.to_string(),
            message: r.message.clone(),
        })
        .collect();
    if plan.rejections.len() > MAX_REASONS {
        reasons.push(ClusterRejection {
            cluster: "*".into(),
            reason: "Truncated".into(),
            message: format!(
                "{} more clusters refused; `fleetctl explain` lists them all",
                plan.rejections.len() - MAX_REASONS
            ),
        });
    }
    let unplaced = (plan.unplaced > 0).then_some(Unplaced { replicas: plan.unplaced as i32, reasons });
    let clusters =
        placements.iter().map(|p| format!("{}:{}/{}", p.cluster, p.ready, p.desired)).collect::<Vec<_>>().join(",");
    ModelDeploymentStatus {
        observed_generation: generation,
        conditions: flotilla_apis::Conditions(merge(&old.conditions.0, &conds, generation, now)),
        replicas: (plan.desired - plan.unplaced) as i32,
        ready_replicas: ready,
        clusters: (!clusters.is_empty()).then_some(clusters),
        placements,
        unplaced,
        // Written by the elected gateway replica (the autoscaler): kept, never cleared here.
        autoscaling: old.autoscaling.clone(),
        refused_pools: refused_pools(&old, observed, now, backoff),
        // Chosen once (`naming.rs`), never cleared: the workloads keep their names.
        workload_suffix: old.workload_suffix.clone(),
    }
}

/// How many pools `status.refusedPools` holds at most (the CRD's `maxItems`).
pub const MAX_REFUSED_POOLS: usize = 64;

/// The scheduler's message is kept to this many bytes in `status.refusedPools`.
const REFUSAL_MESSAGE_MAX: usize = 256;

/// The pools backed off after refusing this deployment's pods: the previous entries whose
/// back-off has not ended (also those of members not observed now), and a new entry for each
/// pool whose pods are refused now and has none, backed off until `now + backoff`. An entry
/// that ends while its pods are still refused starts again at once. At most
/// [`MAX_REFUSED_POOLS`], those that end last.
fn refused_pools(
    old: &ModelDeploymentStatus,
    observed: &Observed,
    now: &Time,
    backoff: std::time::Duration,
) -> Vec<RefusedPool> {
    let mut pools: BTreeMap<Key, RefusedPool> =
        unexpired(&old.refused_pools, now).map(|r| ((r.cluster.clone(), r.pool.clone()), r.clone())).collect();
    let until = now.0.as_second().saturating_add(backoff.as_secs().min(i64::MAX as u64) as i64);
    let until = Time(k8s_openapi::jiff::Timestamp::from_second(until).unwrap_or(now.0));
    if until.0 > now.0 {
        for ((cluster, pool), r) in observed.refused.iter().filter(|(_, r)| r.replicas > 0) {
            pools.entry((cluster.clone(), pool.clone())).or_insert_with(|| RefusedPool {
                cluster: cluster.clone(),
                pool: pool.clone(),
                retry_after: until.clone(),
                devices_short: devices_short(&r.message),
                message: clip(&r.message, REFUSAL_MESSAGE_MAX),
            });
        }
    }
    let mut pools: Vec<RefusedPool> = pools.into_values().collect();
    if pools.len() > MAX_REFUSED_POOLS {
        pools.sort_by(|a, b| {
            b.retry_after.0.cmp(&a.retry_after.0).then(a.cluster.cmp(&b.cluster)).then(a.pool.cmp(&b.pool))
        });
        pools.truncate(MAX_REFUSED_POOLS);
        pools.sort_by(|a, b| a.cluster.cmp(&b.cluster).then(a.pool.cmp(&b.pool)));
    }
    pools
}

/// The entries whose back-off has not ended at `now`.
fn unexpired<'a>(pools: &'a [RefusedPool], now: &'a Time) -> impl Iterator<Item = &'a RefusedPool> {
    pools.iter().filter(|r| r.retry_after.0 > now.0)
}

/// Whether a scheduler's message says devices were short (`Insufficient nvidia.com/gpu`, a
/// DRA claim that cannot be allocated), rather than a taint, a selector, an affinity, or CPU,
/// memory and other node resources this deployment's pods ask for (`Insufficient cpu`), which
/// concern its pods only and must not close the pool to other deployments.
fn devices_short(message: &str) -> bool {
    const NODE_RESOURCES: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pods"];
    let short_of = message
        .split("Insufficient ")
        .skip(1)
        .filter_map(|rest| rest.split([',', ' ', '.', ';', '\n']).find(|w| !w.is_empty()));
    message.contains("cannot allocate all claims")
        || short_of.into_iter().any(|r| !NODE_RESOURCES.contains(&r) && !r.starts_with("hugepages-"))
}

/// `s` cut to at most `max` bytes on a character boundary.
fn clip(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The status of a deployment whose spec cannot be used (a selector that does not compile,
/// nests too deep or costs too much): `Placed`=False, reason `InvalidSpec`, the message naming
/// the field. Everything else is kept as last observed: nothing on members changes and no
/// capacity is asked for until the spec is fixed.
pub fn invalid(
    previous: Option<&ModelDeploymentStatus>,
    generation: Option<i64>,
    invalid: &InvalidSpec,
    now: &Time,
) -> ModelDeploymentStatus {
    let old = previous.cloned().unwrap_or_default();
    let placed = Desired::new(
        condition::PLACED,
        Status::False,
        reason::INVALID_SPEC,
        format!("{}: {}; what already runs is left as it is until the spec is fixed", invalid.field, invalid.message),
    );
    // Back-offs still end: an invalid spec must not keep a pool closed to others forever.
    let refused_pools = unexpired(&old.refused_pools, now).cloned().collect();
    ModelDeploymentStatus {
        observed_generation: generation,
        conditions: flotilla_apis::Conditions(merge(&old.conditions.0, &[placed], generation, now)),
        refused_pools,
        ..old
    }
}

#[cfg(test)]
mod tests {
    use flotilla_placement::plan::{Assignment, Rejection};
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn plan(desired: u32, placed: u32) -> DeploymentPlan {
        DeploymentPlan {
            namespace: "ml".into(),
            name: "m".into(),
            model: "m".into(),
            desired,
            assignments: vec![Assignment {
                cluster: "eu1".into(),
                pool: "h100".into(),
                class: "h100".into(),
                capacity_type: flotilla_apis::CapacityType::OnDemand,
                fallback_rank: 1,
                replicas: placed,
                cost_micros_per_hour: 0,
            }],
            unplaced: desired - placed,
            rejections: (0..40)
                .map(|i| Rejection {
                    cluster: format!("c{i}"),
                    reason: Reason::JurisdictionNotAllowed,
                    message: "x".into(),
                })
                .take(if placed < desired { 40 } else { 0 })
                .collect(),
            ..Default::default()
        }
    }

    fn observed(ready: i32) -> Observed {
        let mut o = Observed::default();
        o.running.insert(("eu1".into(), "h100".into()), Running { applied: 8, ready, current: ready });
        o
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_000).unwrap())
    }

    const BACKOFF: std::time::Duration = std::time::Duration::from_secs(600);

    #[test]
    fn a_refused_pool_stays_backed_off_after_its_pods_are_gone_then_is_dropped() {
        let at = |s: i64| Time(Timestamp::from_second(s).unwrap());
        let refused = |message: &str| super::super::decide::Refusal { replicas: 1, message: message.into() };
        let mut o = observed(7);
        o.refused
            .insert(("eu1".into(), "h100".into()), refused("0/2 nodes are available: 2 Insufficient nvidia.com/gpu."));
        let s = desired(None, Some(1), &plan(8, 7), &o, &at(1_000), BACKOFF);
        assert_eq!(s.refused_pools.len(), 1);
        let r = &s.refused_pools[0];
        assert_eq!(
            (r.cluster.as_str(), r.pool.as_str(), r.retry_after.0.as_second(), r.devices_short),
            ("eu1", "h100", 1_600, true)
        );
        // The refused pod is gone (the replica moved): the pool stays backed off until 1,600...
        let later = desired(Some(&s), Some(1), &plan(8, 7), &observed(7), &at(1_300), BACKOFF);
        assert_eq!(later.refused_pools, s.refused_pools, "not renewed, not dropped");
        // ... and is dropped when that time comes (the solver may try the pool again).
        let ended = desired(Some(&later), Some(1), &plan(8, 7), &observed(7), &at(1_600), BACKOFF);
        assert!(ended.refused_pools.is_empty());
        // Still refused when it ends: backed off again from then.
        let again = desired(Some(&later), Some(1), &plan(8, 7), &o, &at(1_600), BACKOFF);
        assert_eq!(again.refused_pools[0].retry_after.0.as_second(), 2_200);
        // A taint is this deployment's business only: not `devicesShort`.
        let mut t = observed(7);
        t.refused.insert(
            ("eu1".into(), "h100".into()),
            refused("0/2 nodes are available: 2 node(s) had untolerated taint {x: y}."),
        );
        assert!(!desired(None, Some(1), &plan(8, 7), &t, &at(1_000), BACKOFF).refused_pools[0].devices_short);
        // CPU or memory a pod asks for concerns that deployment only, even next to a device
        // shortage on other nodes (which does close the pool to pods as large).
        for (message, short) in [
            ("0/2 nodes are available: 2 Insufficient cpu.", false),
            ("0/2 nodes are available: 1 Insufficient memory, 1 Insufficient hugepages-2Mi.", false),
            ("0/3 nodes are available: 1 Insufficient cpu, 2 Insufficient nvidia.com/gpu.", true),
            ("0/2 nodes are available: 2 cannot allocate all claims.", true),
        ] {
            let mut c = observed(7);
            c.refused.insert(("eu1".into(), "h100".into()), refused(message));
            assert_eq!(
                desired(None, Some(1), &plan(8, 7), &c, &at(1_000), BACKOFF).refused_pools[0].devices_short,
                short,
                "{message}"
            );
        }
        // No back-off configured: nothing kept.
        assert!(
            desired(None, Some(1), &plan(8, 7), &o, &at(1_000), std::time::Duration::ZERO).refused_pools.is_empty()
        );
        // Bounded: at most MAX_REFUSED_POOLS entries, those that end last.
        let mut many = observed(7);
        for i in 0..MAX_REFUSED_POOLS + 5 {
            many.refused.insert((format!("c{i:03}"), "h100".into()), refused("x"));
        }
        let old = ModelDeploymentStatus {
            refused_pools: vec![RefusedPool {
                cluster: "old".into(),
                pool: "p".into(),
                retry_after: at(1_100),
                devices_short: false,
                message: String::new(),
            }],
            ..Default::default()
        };
        let s = desired(Some(&old), Some(1), &plan(8, 7), &many, &at(1_000), BACKOFF);
        assert_eq!(s.refused_pools.len(), MAX_REFUSED_POOLS);
        assert!(!s.refused_pools.iter().any(|r| r.cluster == "old"), "the one ending first is left out");
    }

    #[test]
    fn refused_replicas_are_counted_once_and_not_those_a_scale_down_removes() {
        let refused = |replicas| super::super::decide::Refusal { replicas, message: "0/2 nodes".into() };
        // 8 asked for and wanted, 2 refused: the placement says 2.
        let mut o = observed(6);
        o.refused.insert(("eu1".into(), "h100".into()), refused(2));
        let s = desired(None, Some(1), &plan(8, 8), &o, &now(), BACKOFF);
        assert_eq!(s.placements[0].unschedulable, 2);
        // The plan now wants 7 there (one moved away): the scale-down 8 → 7 removes one of the
        // refused pods first, so one is left to say.
        let s = desired(None, Some(1), &plan(8, 7), &o, &now(), BACKOFF);
        assert_eq!(s.placements[0].unschedulable, 1);
        // Wants 6: both go with the scale-down, none is said (the running 6 stay where they are).
        let s = desired(None, Some(1), &plan(8, 6), &o, &now(), BACKOFF);
        assert_eq!(s.placements[0].unschedulable, 0);
        // Twin: nothing refused, nothing said (and left out of the serialised status).
        let s = desired(None, Some(1), &plan(8, 8), &observed(6), &now(), BACKOFF);
        assert_eq!(s.placements[0].unschedulable, 0);
        assert!(serde_json::to_value(&s.placements[0]).unwrap().get("unschedulable").is_none());
    }

    #[test]
    fn one_of_eight_is_degraded_never_ready() {
        let s = desired(None, Some(1), &plan(8, 8), &observed(1), &now(), BACKOFF);
        assert_eq!(s.ready_replicas, 1);
        assert_eq!(s.conditions.get("Ready").unwrap().status, "False");
        assert_eq!(s.conditions.get("Degraded").unwrap().status, "True");
        // Twin: all eight ready.
        let s = desired(None, Some(1), &plan(8, 8), &observed(8), &now(), BACKOFF);
        assert!(s.conditions.is_true("Ready"));
        assert_eq!(s.conditions.get("Degraded").unwrap().status, "False");
    }

    #[test]
    fn nothing_observed_is_not_ready() {
        let s = desired(None, Some(1), &plan(2, 2), &Observed::default(), &now(), BACKOFF);
        assert_eq!(s.conditions.get("Ready").unwrap().reason, "NoReplicasReady");
    }

    #[test]
    fn unplaced_is_reported_with_bounded_reasons() {
        let s = desired(None, Some(1), &plan(6, 4), &observed(4), &now(), BACKOFF);
        let placed = s.conditions.get("Placed").unwrap();
        assert_eq!(placed.status, "False");
        assert!(placed.message.starts_with("4 of 6 replicas placed"), "{}", placed.message);
        let u = s.unplaced.unwrap();
        assert_eq!(u.replicas, 2);
        assert_eq!(u.reasons.len(), MAX_REASONS + 1);
        assert_eq!(u.reasons.last().unwrap().reason, "Truncated");
    }

    #[test]
    fn waiting_for_cache_names_clusters_and_phases() {
        let mut o = observed(0);
        o.cache = Some(CacheWait {
            cache: "ml/llama".into(),
            waiting: BTreeMap::from([
                ("eu1".into(), "Downloading".into()),
                ("eu2".into(), "Failed (DigestMismatch)".into()),
            ]),
        });
        let s = desired(None, Some(1), &plan(2, 2), &o, &now(), BACKOFF);
        let c = s.conditions.get("WaitingForCache").unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "CacheNotReady"));
        assert!(c.message.contains("eu1 (Downloading), eu2 (Failed (DigestMismatch))"), "{}", c.message);
        // Twins: Ready everywhere is False; no cacheRef writes no such condition at all.
        o.cache = Some(CacheWait { cache: "ml/llama".into(), waiting: BTreeMap::new() });
        let s = desired(Some(&s), Some(1), &plan(2, 2), &o, &now(), BACKOFF);
        assert_eq!(s.conditions.get("WaitingForCache").unwrap().status, "False");
        let s = desired(None, Some(1), &plan(2, 2), &observed(0), &now(), BACKOFF);
        assert!(s.conditions.get("WaitingForCache").is_none());
    }

    #[test]
    fn an_unobserved_member_keeps_its_placement_until_its_cluster_is_gone() {
        let running = desired(None, Some(1), &plan(2, 2), &observed(2), &now(), BACKOFF);
        assert_eq!(running.placements.len(), 1);
        let cluster = running.placements[0].cluster.clone();
        // The plan no longer wants it (the member is down) and it cannot be observed.
        let mut down = Observed::default();
        down.unreachable.insert(cluster.clone(), "connection failed".into());
        let nowhere = DeploymentPlan { assignments: vec![], ..plan(2, 0) };
        let kept = desired(Some(&running), Some(1), &nowhere, &down, &now(), BACKOFF);
        assert_eq!(kept.placements.len(), 1, "still where the objects may be");
        assert_eq!((kept.placements[0].desired, kept.placements[0].ready), (0, 0), "no stale evidence");
        down.vanished.insert(cluster);
        assert!(desired(Some(&kept), Some(1), &nowhere, &down, &now(), BACKOFF).placements.is_empty());
    }

    #[test]
    fn a_rollout_in_progress_is_not_ready_on_the_old_spec_but_still_serving() {
        // 8 replicas ready on the previous spec, none on the current one yet.
        let mut o = Observed::default();
        o.running.insert(("eu1".into(), "h100".into()), Running { applied: 8, ready: 8, current: 0 });
        let s = desired(None, Some(2), &plan(8, 8), &o, &now(), BACKOFF);
        assert_eq!(s.ready_replicas, 0);
        assert_eq!(s.conditions.get("Ready").unwrap().reason, "NoReplicasReady");
        assert_eq!((s.placements[0].ready, s.placements[0].serving), (0, 8), "they serve: the gateway routes");
        // Half way: 4 on the current spec.
        o.running.insert(("eu1".into(), "h100".into()), Running { applied: 8, ready: 8, current: 4 });
        let s = desired(Some(&s), Some(2), &plan(8, 8), &o, &now(), BACKOFF);
        assert_eq!(s.ready_replicas, 4);
        assert!(s.conditions.is_true("Degraded"));
    }

    #[test]
    fn the_autoscalers_status_is_kept_by_the_controllers_write() {
        use flotilla_apis::autoscaling::{AutoscalingReason, AutoscalingStatus};
        let mut before = desired(None, Some(1), &plan(2, 2), &observed(2), &now(), BACKOFF);
        before.autoscaling = Some(AutoscalingStatus {
            recommendation: 2,
            reason: Some(AutoscalingReason::Steady),
            ..Default::default()
        });
        let next = desired(Some(&before), Some(1), &plan(2, 2), &observed(2), &now(), BACKOFF);
        assert_eq!(next.autoscaling, before.autoscaling);
        // And so the status patch neither nulls nor rewrites it.
        let patch = crate::status_patch::status_patch(Some(&before), &next).unwrap();
        assert_eq!(patch["status"]["autoscaling"]["reason"], "Steady");
        assert_eq!(next, before, "nothing else changed: no write at all");
    }

    #[test]
    fn capacity_says_which_minimum_is_unmet_when_every_replica_is_placed() {
        let mut p = plan(4, 4);
        p.unmet_minimums = vec![flotilla_placement::plan::UnmetMinimum { rank: 2, wanted: 4, placed: 2 }];
        let s = desired(None, Some(1), &p, &observed(4), &now(), BACKOFF);
        let c = s.conditions.get(condition::CAPACITY_AVAILABLE).unwrap();
        assert_eq!(c.status, "False");
        assert_eq!(c.message, "alternative 2 wants at least 4 replica(s) and only 2 could be placed on it");
        assert!(!c.message.contains("0 replica"), "{}", c.message);
        let s = desired(None, Some(1), &plan(4, 3), &observed(3), &now(), BACKOFF);
        let c = s.conditions.get(condition::CAPACITY_AVAILABLE).unwrap();
        assert_eq!(c.message, "1 replica(s) need capacity the fleet does not have");
    }

    #[test]
    fn same_inputs_same_status_so_no_write() {
        let a = desired(None, Some(1), &plan(2, 2), &observed(2), &now(), BACKOFF);
        let later = Time(Timestamp::from_second(2_000).unwrap());
        let b = desired(Some(&a), Some(1), &plan(2, 2), &observed(2), &later, BACKOFF);
        assert_eq!(a, b);
    }

    #[test]
    fn invalid_spec_says_so_naming_the_field_and_keeps_the_rest() {
        let before = desired(None, Some(1), &plan(4, 4), &observed(4), &now(), BACKOFF);
        let bad = InvalidSpec { field: "spec.devices.alternatives[0].selectors[0]".into(), message: "too deep".into() };
        let after = invalid(Some(&before), Some(2), &bad, &now());
        let placed = after.conditions.0.iter().find(|c| c.type_ == condition::PLACED).expect("Placed");
        assert_eq!((placed.status.as_str(), placed.reason.as_str()), ("False", reason::INVALID_SPEC));
        assert!(
            placed.message.starts_with("spec.devices.alternatives[0].selectors[0]: too deep"),
            "{}",
            placed.message
        );
        // Nothing else changes: placements, ready counts and the other conditions stay.
        assert_eq!(
            (after.placements.clone(), after.ready_replicas),
            (before.placements.clone(), before.ready_replicas)
        );
        let others = |s: &ModelDeploymentStatus| -> Vec<_> {
            s.conditions
                .0
                .iter()
                .filter(|c| c.type_ != condition::PLACED)
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect()
        };
        assert_eq!(others(&after), others(&before));
        assert_eq!(invalid(Some(&after), Some(2), &bad, &now()), after, "the same invalid spec writes nothing new");
    }
}
