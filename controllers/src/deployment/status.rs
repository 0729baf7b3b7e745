//! The status a ModelDeployment should have, from the plan and from what members report. Ready
//! counts come only from member workloads' ready replicas of the current spec
//! (`members/readiness.rs`): a rollout in progress is not Ready on the old spec; 1 of 8 ready
//! is `Degraded`, never `Ready`. `serving` counts ready replicas of any spec. Pure, so that a reconcile that learns nothing new writes nothing.

use std::collections::BTreeMap;

use flotilla_apis::conditions::{Desired, Status, merge};
use flotilla_apis::constants::{condition, reason};
use flotilla_apis::deployment::{ClusterPlacement, ClusterRejection, ModelDeploymentStatus, RefusedPool, Unplaced};
use flotilla_placement::plan::{Assignment, DeploymentPlan, InvalidSpec, Reason, Rejection};
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
    /// Its adapters, their caches and its clusters: `status.adapters` (`adapters.rs`).
    pub adapters: super::adapters::AdapterView,
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
    let placements = placements(plan, observed, &old.placements);
    let desired_total = plan.desired as i32;
    let ready = ready_replicas(&placements, desired_total);
    let trouble = Trouble::of(observed);
    let mut conds = vec![
        placed_condition(plan, observed.claim.as_deref()),
        capacity_condition(plan),
        ready_condition(ready, desired_total, &trouble),
        degraded_condition(ready, desired_total, &trouble),
    ];
    conds.extend(cache_condition(&old, observed));
    ModelDeploymentStatus {
        observed_generation: generation,
        conditions: flotilla_apis::Conditions(merge(&old.conditions.0, &conds, generation, now)),
        replicas: (plan.desired - plan.unplaced) as i32,
        ready_replicas: ready,
        clusters: clusters_column(&placements),
        unplaced: unplaced(plan),
        // Written by the elected gateway replica (the autoscaler): kept, never cleared here.
        autoscaling: old.autoscaling.clone(),
        refused_pools: refused_pools(&old, observed, now, backoff),
        // Chosen once (`naming.rs`), never cleared: the workloads keep their names.
        workload_suffix: old.workload_suffix.clone(),
        // Per adapter, over every cluster the status places the deployment in (draining and
        // unobserved ones too: replicas there may still load it).
        adapters: observed.adapters.statuses(placements.iter().map(|p| p.cluster.as_str())),
        placements,
    }
}

/// `status.placements`, sorted by (cluster, pool): each of the plan's assignments with what
/// its member reports, then the pools still running replicas the plan no longer wants, then
/// the previous placements of members that could not be observed.
fn placements(plan: &DeploymentPlan, observed: &Observed, old: &[ClusterPlacement]) -> Vec<ClusterPlacement> {
    let mut placements: Vec<ClusterPlacement> = plan.assignments.iter().map(|a| planned(a, observed)).collect();
    add_draining(&mut placements, observed, old);
    add_unseen(&mut placements, observed, old);
    placements.sort_by(|a, b| a.cluster.cmp(&b.cluster).then(a.pool.cmp(&b.pool)));
    placements
}

/// One assignment of the plan as a placement: ready on the current spec, serving on any, and
/// the refused replicas the plan still wants there.
fn planned(a: &Assignment, observed: &Observed) -> ClusterPlacement {
    let key = (a.cluster.clone(), a.pool.clone());
    let r = observed.running.get(&key).copied().unwrap_or_default();
    let refused = observed.refused.get(&key).map_or(0, |f| f.replicas);
    let unschedulable = unschedulable(refused, r.applied, a.replicas as i32);
    ClusterPlacement { serving: r.ready, unschedulable, ..a.to_placement(r.current) }
}

/// Of `refused` replicas in a pool asked for `applied` and now `wanted`, those still to say:
/// a scale-down removes pods that are on no node first, so the replicas it removes are not
/// among them. Never below 0 nor above `wanted`.
fn unschedulable(refused: i32, applied: i32, wanted: i32) -> i32 {
    (refused - (applied - wanted).max(0)).clamp(0, wanted)
}

/// Appends the pools still running replicas where the plan no longer wants them (draining,
/// make-before-break): desired 0, class, capacity type and rank as the previous status had
/// them (on-demand, rank 1 without one), and every replica refused there — still said while
/// its pods wait: the pool takes no new replicas meanwhile.
fn add_draining(placements: &mut Vec<ClusterPlacement>, observed: &Observed, old: &[ClusterPlacement]) {
    for ((cluster, pool), r) in &observed.running {
        if r.applied > 0 && !holds(placements, cluster, pool) {
            let prev = old.iter().find(|p| p.cluster == *cluster && p.pool == *pool);
            placements.push(ClusterPlacement {
                cluster: cluster.clone(),
                pool: pool.clone(),
                class: prev.map(|p| p.class.clone()).unwrap_or_default(),
                capacity_type: prev.map_or(flotilla_apis::CapacityType::OnDemand, |p| p.capacity_type),
                fallback_rank: prev.map_or(1, |p| p.fallback_rank),
                desired: 0,
                ready: r.current,
                serving: r.ready,
                unschedulable: observed.refused.get(&(cluster.clone(), pool.clone())).map_or(0, |f| f.replicas),
            });
        }
    }
}

/// Appends the previous placements of members that could not be observed (and whose cluster
/// still exists), desired and ready 0 (not evidence now). Status placements are where this
/// deployment's objects may be, which the next reconcile prunes and the deletion cleans:
/// dropping them while the member is down would let a deletion forget the objects still there.
fn add_unseen(placements: &mut Vec<ClusterPlacement>, observed: &Observed, old: &[ClusterPlacement]) {
    for p in old {
        let unseen = observed.unreachable.contains_key(&p.cluster) && !observed.vanished.contains(&p.cluster);
        if unseen && !holds(placements, &p.cluster, &p.pool) {
            placements.push(ClusterPlacement { desired: 0, ready: 0, ..p.clone() });
        }
    }
}

/// Whether `placements` has one for (`cluster`, `pool`).
fn holds(placements: &[ClusterPlacement], cluster: &str, pool: &str) -> bool {
    placements.iter().any(|p| p.cluster == cluster && p.pool == pool)
}

/// `status.readyReplicas`: the placements' ready replicas (draining ones too), at most the
/// replicas desired.
fn ready_replicas(placements: &[ClusterPlacement], desired_total: i32) -> i32 {
    placements.iter().map(|p| p.ready).sum::<i32>().min(desired_total.max(0))
}

/// Every replica placed and every alternative's `minReplicas` met.
fn fully_placed(plan: &DeploymentPlan) -> bool {
    plan.unplaced == 0 && plan.unmet_minimums.is_empty()
}

/// `Placed`: true when fully placed (`FallbackSelected` when some replica is on a fallback
/// alternative); otherwise false, why, and the CapacityClaim asking for the rest if any.
fn placed_condition(plan: &DeploymentPlan, claim: Option<&str>) -> Desired {
    if fully_placed(plan) {
        let fallback = plan.assignments.iter().any(|a| a.fallback_rank > 1);
        let why = if fallback { reason::FALLBACK_SELECTED } else { reason::PLACED };
        return Desired::new(condition::PLACED, Status::True, why, placed_message(plan));
    }
    let mut message = placed_message(plan);
    if let Some(claim) = claim {
        message.push_str(&format!(
            "; CapacityClaim {claim} asks a provider for the missing capacity (see its Fulfilled condition)"
        ));
    }
    Desired::new(condition::PLACED, Status::False, not_placed_reason(plan, claim.is_some()), message)
}

/// Why a plan is not fully placed, the first that holds: a CapacityClaim asks a provider for
/// the rest; a FleetQuota of the namespace holds replicas back; a cluster refused over the cost
/// ceiling; some cluster refused for want of room
/// rather than by a rule, or some replicas were placed (`InsufficientCapacity`); else no
/// cluster is eligible at all.
fn not_placed_reason(plan: &DeploymentPlan, claim_pending: bool) -> &'static str {
    let eligible = plan.rejections.iter().any(|r| !r.reason.is_static());
    if claim_pending {
        reason::CLAIM_PENDING
    } else if flotilla_placement::claim::held_by_quota(plan) {
        reason::QUOTA_EXCEEDED
    } else if plan.rejections.iter().any(|r| r.reason == Reason::CostCeilingExceeded) {
        reason::COST_CEILING_EXCEEDED
    } else if eligible || plan.desired > plan.unplaced {
        reason::INSUFFICIENT_CAPACITY
    } else {
        reason::NO_ELIGIBLE_CLUSTER
    }
}

/// `CapacityAvailable`: false when the plan is not fully placed, saying how many replicas
/// found no room and which alternative's `minReplicas` is unmet (every replica may be placed
/// with one unmet: it says which, not "0 replicas").
fn capacity_condition(plan: &DeploymentPlan) -> Desired {
    if fully_placed(plan) {
        return Desired::new(
            condition::CAPACITY_AVAILABLE,
            Status::True,
            reason::AS_EXPECTED,
            "the fleet has room for every replica",
        );
    }
    let mut short: Vec<String> = Vec::new();
    if flotilla_placement::claim::held_by_quota(plan) {
        short.push(format!(
            "{} replica(s) unplaced: a FleetQuota of the namespace holds them back (status.unplaced names it)",
            plan.unplaced
        ));
    } else if plan.unplaced > 0 {
        short.push(format!("{} replica(s) need capacity the fleet does not have", plan.unplaced));
    }
    short.extend(plan.unmet_minimums.iter().map(|m| {
        format!(
            "alternative {} wants at least {} replica(s) and only {} could be placed on it",
            m.rank, m.wanted, m.placed
        )
    }));
    Desired::new(condition::CAPACITY_AVAILABLE, Status::False, reason::INSUFFICIENT_CAPACITY, short.join("; "))
}

/// What went wrong on members, as `Ready` and `Degraded` say it.
struct Trouble {
    /// `cluster: why` for each member that could not be observed, then `cluster: apply
    /// failed: why` for each that refused the objects.
    problems: Vec<String>,
    /// Whether some member refused the objects.
    apply_failed: bool,
    /// `cluster: object` for each member where someone else's object holds a name.
    conflicts: Vec<String>,
}

impl Trouble {
    fn of(observed: &Observed) -> Self {
        let mut problems: Vec<String> = observed.unreachable.iter().map(|(c, m)| format!("{c}: {m}")).collect();
        problems.extend(observed.apply_failed.iter().map(|(c, m)| format!("{c}: apply failed: {m}")));
        let conflicts = observed.name_conflicts.iter().map(|(c, m)| format!("{c}: {m}")).collect();
        Trouble { problems, apply_failed: !observed.apply_failed.is_empty(), conflicts }
    }

    /// `; problem; problem` to end a message with, or nothing.
    fn tail(&self) -> String {
        if self.problems.is_empty() { String::new() } else { format!("; {}", self.problems.join("; ")) }
    }

    /// What `Ready` and `Degraded` say while names are taken.
    fn conflict_message(&self, ready: i32, desired_total: i32) -> String {
        format!(
            "{ready}/{desired_total} replicas ready; names taken by objects that are not this deployment's: {}; rename \
             the ModelDeployment or the other object{}",
            self.conflicts.join("; "),
            self.tail()
        )
    }
}

/// `Ready`: false on a name conflict (someone else's Service or workload is not serving this
/// model); true when every desired replica is ready, or none is desired; else false, saying
/// whether none or only some are ready and what went wrong on members.
fn ready_condition(ready: i32, desired_total: i32, trouble: &Trouble) -> Desired {
    let ready_cond = |status, why, message| Desired::new(condition::READY, status, why, message);
    if !trouble.conflicts.is_empty() {
        ready_cond(Status::False, reason::NAME_CONFLICT, trouble.conflict_message(ready, desired_total))
    } else if desired_total > 0 && ready >= desired_total {
        ready_cond(Status::True, reason::ALL_REPLICAS_READY, format!("{ready}/{desired_total} replicas ready"))
    } else if desired_total == 0 {
        ready_cond(Status::True, reason::AS_EXPECTED, "scaled to zero".into())
    } else if ready == 0 {
        ready_cond(
            Status::False,
            reason::NO_REPLICAS_READY,
            format!("0/{desired_total} replicas ready{}", trouble.tail()),
        )
    } else {
        ready_cond(
            Status::False,
            reason::REPLICAS_NOT_READY,
            format!("{ready}/{desired_total} replicas ready{}", trouble.tail()),
        )
    }
}

/// `Degraded`: true on a name conflict, when some but not all replicas are ready, or when a
/// member refused the objects; false otherwise (none ready is not degraded: `Ready` says it).
fn degraded_condition(ready: i32, desired_total: i32, trouble: &Trouble) -> Desired {
    let degraded = |status, why, message| Desired::new(condition::DEGRADED, status, why, message);
    if !trouble.conflicts.is_empty() {
        degraded(Status::True, reason::NAME_CONFLICT, trouble.conflict_message(ready, desired_total))
    } else if ready > 0 && ready < desired_total {
        degraded(
            Status::True,
            reason::REPLICAS_NOT_READY,
            format!("{ready}/{desired_total} replicas ready{}", trouble.tail()),
        )
    } else if trouble.apply_failed {
        degraded(Status::True, reason::APPLY_FAILED, trouble.problems.join("; "))
    } else {
        degraded(Status::False, reason::AS_EXPECTED, format!("{ready}/{desired_total} replicas ready"))
    }
}

/// `status.unplaced` while replicas are: how many, and each refusing cluster's reason.
fn unplaced(plan: &DeploymentPlan) -> Option<Unplaced> {
    (plan.unplaced > 0).then(|| Unplaced { replicas: plan.unplaced as i32, reasons: reasons(&plan.rejections) })
}

/// The clusters' reasons, bounded: a fleet of thousands of clusters must not make a status of
/// megabytes. The first [`MAX_REASONS`], then one `*` entry counting the rest.
fn reasons(rejections: &[Rejection]) -> Vec<ClusterRejection> {
    let mut reasons: Vec<ClusterRejection> = rejections
        .iter()
        .take(MAX_REASONS)
        .map(|r| ClusterRejection {
            cluster: r.cluster.clone(),
            reason: r.reason.to_string(),
            message: r.message.clone(),
        })
        .collect();
    if rejections.len() > MAX_REASONS {
        reasons.push(ClusterRejection {
            cluster: "*".into(),
            reason: "Truncated".into(),
            message: format!(
                "{} more clusters refused; `fleetctl explain` lists them all",
                rejections.len() - MAX_REASONS
            ),
        });
    }
    reasons
}

/// `status.clusters` (a printer column): `cluster:ready/desired` per placement, comma
/// separated; none without placements.
fn clusters_column(placements: &[ClusterPlacement]) -> Option<String> {
    let clusters = placements.iter().map(|p| format!("{}:{}/{}", p.cluster, p.ready, p.desired)).collect::<Vec<_>>();
    (!clusters.is_empty()).then(|| clusters.join(","))
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
#[path = "status_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "status_steps_tests.rs"]
mod step_tests;
