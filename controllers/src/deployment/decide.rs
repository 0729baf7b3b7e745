//! What one ModelDeployment reconcile does, decided without I/O: from the deployment (spec and
//! current status), its plan entry, what its members showed, its ModelCache's phases, its
//! adapters' caches and clusters (`adapters.rs`: what each member may load), the classes and
//! `now`, the make-before-break step per (cluster, pool), the objects each member
//! that answered should hold (the rest of the deployment's objects there are pruned), the
//! status written ahead of fresh clusters, and the final status, events and pace of the next
//! look. The reconcile (`mod.rs`) only reads before and writes after; the tests are here.
//!
//! Invariants: a member gets objects only when the status in effect while they are applied
//! (the write-ahead, else the current status) names it, so a deletion always finds them; a
//! member that did not answer is neither written nor pruned, and keeps its placements; an
//! invalid spec touches no member; an adapter is rendered in a member only where
//! `status.adapters` serves it (one check for both).

use std::collections::{BTreeMap, BTreeSet};

use flotilla_apis::ModelDeployment;
use flotilla_apis::cache::CachePhase;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::cluster::GatewayRef;
use flotilla_apis::constants::event;
use flotilla_apis::deployment::ModelDeploymentStatus;
use flotilla_placement::plan::DeploymentPlan;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::adapters::AdapterView;
use super::rollout::{self, Key, Running};
use super::status::{self, CacheWait, Observed};
use crate::render::{PoolWorkload, render};

/// What the members involved in a deployment showed (`observe.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Members that answered: their objects may be written and pruned this time.
    pub answered: BTreeSet<String>,
    /// Per (cluster, pool) of the members that answered: replicas asked for and ready.
    pub running: BTreeMap<Key, Running>,
    /// Members that could not be observed, with why.
    pub unreachable: BTreeMap<String, String>,
    /// Of those, the ones whose InferenceCluster no longer exists.
    pub vanished: BTreeSet<String>,
    /// Per (cluster, pool): replicas whose pods the member's scheduler refused for longer
    /// than the grace (`observe.rs`).
    pub refused: BTreeMap<Key, Refusal>,
}

/// Replicas of a pool the member's scheduler refused, and its word on one of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refusal {
    /// Replicas asked for there that have no pod on a node and a refused one.
    pub replicas: i32,
    /// The scheduler's message.
    pub message: String,
}

/// The ModelCache a deployment references, as the control cluster knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheView {
    /// `namespace/name`.
    pub name: String,
    /// Whether the ModelCache exists.
    pub exists: bool,
    /// Cluster → the cache's phase there and, for a failure, its reason.
    pub phases: BTreeMap<String, (CachePhase, Option<String>)>,
}

/// Everything a decision reads.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The deployment: spec, generation and current status.
    pub md: &'a ModelDeployment,
    /// The suffix its workload names carry (`naming.rs`): recorded in its status before the
    /// first object carries it.
    pub workload_suffix: Option<&'a str>,
    /// Its entry in the fleet plan.
    pub plan: &'a DeploymentPlan,
    /// Its members.
    pub seen: &'a Seen,
    /// The CapacityClaim it owns (`namespace/name`), while one exists.
    pub claim: Option<&'a str>,
    /// Its ModelCache, when the spec has a `cacheRef`.
    pub cache: Option<&'a CacheView>,
    /// Its adapters, their ModelCaches and its clusters (`adapters.rs`).
    pub adapters: &'a AdapterView,
    /// Class specs by name.
    pub classes: &'a BTreeMap<String, InferenceClassSpec>,
    /// Clusters that publish DRA devices (their pods get ResourceClaims).
    pub dra: &'a BTreeSet<String>,
    /// Clusters whose InferenceCluster names a member Gateway (`spec.gatewayRef`): their
    /// deployments get an HTTPRoute to it.
    pub gateways: &'a BTreeMap<String, GatewayRef>,
    /// Now, to the second (what the API server keeps of condition times).
    pub now: &'a Time,
    /// How long a pool that refused the deployment's pods is backed off (`status.refusedPools`).
    pub backoff: std::time::Duration,
}

/// When to look again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// Only when something changes (an invalid spec).
    AwaitChange,
    /// Replicas moving or starting: soon.
    Converging,
    /// Replicas held for the ModelCache: its status changing wakes the deployment, so no fast
    /// polling.
    WaitingForCache,
    /// Every replica ready where the plan wants it, every member answered: the safety-net
    /// resync only (changes of the fleet wake the deployment).
    Settled,
}

/// An event to record on the deployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Event reason (`flotilla_apis::constants::event`).
    pub reason: &'static str,
    /// Event action.
    pub action: &'static str,
    /// What happened.
    pub message: String,
    /// A `Warning` event (else `Normal`).
    pub warning: bool,
}

/// The status to write after the members, the events and the pace.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The final status (written only when it differs from the one in effect).
    pub status: ModelDeploymentStatus,
    /// Events to record.
    pub events: Vec<Note>,
    /// When to look again.
    pub pace: Pace,
}

/// What one reconcile does.
#[derive(Clone, Debug)]
pub struct Decision {
    /// Replicas to ask for per (cluster, pool) now (make-before-break, cache-gated).
    pub step: BTreeMap<Key, i32>,
    /// For each member to write: the objects it should hold; the deployment's other objects
    /// there are pruned. Members absent here are not touched.
    pub members: BTreeMap<String, Vec<Value>>,
    /// A status written before any member is, because it names clusters about to get objects
    /// that the current status does not name.
    pub write_ahead: Option<ModelDeploymentStatus>,
    /// Status, events and pace when every member write succeeds ([`Decision::after_failures`]
    /// otherwise).
    pub outcome: Outcome,
    target: BTreeMap<Key, i32>,
    observed: Observed,
}

/// The clusters a reconcile observes: where the plan wants replicas and where the status says
/// some may be.
pub fn involved(md: &ModelDeployment, plan: &DeploymentPlan) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = plan.assignments.iter().map(|a| a.cluster.clone()).collect();
    out.extend(md.status.iter().flat_map(|s| s.placements.iter()).map(|p| p.cluster.clone()));
    out
}

/// The decision.
pub fn decide(input: &Input<'_>) -> Decision {
    let (md, plan, seen) = (input.md, input.plan, input.seen);
    if let Some(invalid) = &plan.invalid {
        // A spec that cannot be used changes nothing on members: only its status says why.
        let status = status::invalid(md.status.as_ref(), md.metadata.generation, invalid, input.now);
        return Decision {
            step: BTreeMap::new(),
            members: BTreeMap::new(),
            write_ahead: None,
            outcome: Outcome { status, events: Vec::new(), pace: Pace::AwaitChange },
            target: BTreeMap::new(),
            observed: Observed::default(),
        };
    }
    let target: BTreeMap<Key, i32> =
        plan.assignments.iter().map(|a| ((a.cluster.clone(), a.pool.clone()), a.replicas as i32)).collect();
    let mut observed = Observed {
        running: seen.running.clone(),
        unreachable: seen.unreachable.clone(),
        vanished: seen.vanished.clone(),
        refused: seen.refused.clone(),
        claim: input.claim.map(str::to_string),
        adapters: input.adapters.clone(),
        ..Default::default()
    };
    let mut step = rollout::step(&target, &observed.running, plan.desired as i32);
    if let Some(cache) = input.cache {
        observed.cache = Some(gate_on_cache(cache, &mut step, &observed.running));
    }
    let mut write_ahead = write_ahead(input, &step, &observed);
    // A suffix newly chosen is in the status before any object carries it: kept from then on,
    // whatever happens to the deployment it avoids.
    let recorded = md.status.as_ref().and_then(|s| s.workload_suffix.as_deref());
    if input.workload_suffix.is_some() && recorded != input.workload_suffix {
        let mut ahead = write_ahead.take().unwrap_or_else(|| {
            status::desired(md.status.as_ref(), md.metadata.generation, input.plan, &observed, input.now, input.backoff)
        });
        ahead.workload_suffix = input.workload_suffix.map(str::to_string);
        write_ahead = Some(ahead);
    }
    let in_effect: BTreeSet<&str> = write_ahead
        .as_ref()
        .or(md.status.as_ref())
        .iter()
        .flat_map(|s| s.placements.iter())
        .map(|p| p.cluster.as_str())
        .collect();
    let mut members = BTreeMap::new();
    for cluster in &seen.answered {
        let objects = objects_for(input, cluster, &step);
        // Never objects where no status would name them (the write-ahead covers every fresh
        // cluster by construction; this keeps the invariant if that ever changes).
        if objects.is_empty() || in_effect.contains(cluster.as_str()) {
            members.insert(cluster.clone(), objects);
        }
    }
    let outcome = conclude(input, &target, &step, &observed, write_ahead.as_ref());
    Decision { step, members, write_ahead, outcome, target, observed }
}

impl Decision {
    /// The outcome when the members in `failed` (cluster → why) could not be written: they are
    /// reported (`Degraded`, reason `ApplyFailed`) and the deployment is not settled.
    pub fn after_failures(
        &self,
        input: &Input<'_>,
        failed: &BTreeMap<String, String>,
        conflicts: &BTreeMap<String, String>,
    ) -> Outcome {
        if (failed.is_empty() && conflicts.is_empty()) || input.plan.invalid.is_some() {
            return self.outcome.clone();
        }
        let observed =
            Observed { apply_failed: failed.clone(), name_conflicts: conflicts.clone(), ..self.observed.clone() };
        conclude(input, &self.target, &self.step, &observed, self.write_ahead.as_ref())
    }
}

/// Holds back replicas where the cache is not Ready; says where and why.
fn gate_on_cache(cache: &CacheView, step: &mut BTreeMap<Key, i32>, running: &BTreeMap<Key, Running>) -> CacheWait {
    let phase = |cluster: &str| cache.phases.get(cluster);
    let held = rollout::gate_on_cache(step, running, |c| phase(c).is_some_and(|(p, _)| *p == CachePhase::Ready));
    let waiting = held
        .into_iter()
        .map(|c| {
            let what = match (cache.exists, phase(&c)) {
                (false, _) => "the ModelCache does not exist".to_string(),
                (true, None) => "not staged there yet".to_string(),
                (true, Some((CachePhase::Failed, Some(r)))) => format!("Failed: {r}"),
                (true, Some((p, _))) => format!("{p:?}"),
            };
            (c, what)
        })
        .collect();
    CacheWait { cache: cache.name.clone(), waiting }
}

/// Write-ahead: a cluster about to get this deployment's objects is recorded in status first.
/// Status placements are what later reconciles observe, prune and clean up; objects created
/// where no landed status names them (the status write after them lost a conflict) would run
/// on, unobserved, forever. Only clusters that answered get objects, so only they are fresh.
fn write_ahead(input: &Input<'_>, step: &BTreeMap<Key, i32>, observed: &Observed) -> Option<ModelDeploymentStatus> {
    let md = input.md;
    let recorded: BTreeSet<&str> =
        md.status.iter().flat_map(|s| s.placements.iter()).map(|p| p.cluster.as_str()).collect();
    let fresh =
        step.iter().any(|(k, r)| *r > 0 && input.seen.answered.contains(&k.0) && !recorded.contains(k.0.as_str()));
    fresh.then(|| {
        status::desired(md.status.as_ref(), md.metadata.generation, input.plan, observed, input.now, input.backoff)
    })
}

/// The rendered objects one member should hold for this step.
fn objects_for(input: &Input<'_>, cluster: &str, step: &BTreeMap<Key, i32>) -> Vec<Value> {
    let (md, plan) = (input.md, input.plan);
    let mut pools: Vec<PoolWorkload<'_>> = Vec::new();
    for ((c, pool), replicas) in step {
        if c != cluster || *replicas <= 0 {
            continue;
        }
        // The class and alternative of the plan's assignment; for replicas the plan no longer
        // wants here (draining), those the status recorded.
        let Some((class, rank)) = plan
            .assignments
            .iter()
            .find(|a| a.cluster == *c && a.pool == *pool)
            .map(|a| (a.class.as_str(), a.fallback_rank))
            .or_else(|| {
                md.status
                    .as_ref()?
                    .placements
                    .iter()
                    .find(|p| p.cluster == *c && p.pool == *pool)
                    .map(|p| (p.class.as_str(), p.fallback_rank.max(1) as u32))
            })
        else {
            continue;
        };
        let (Some(class), Some(alternative)) =
            (input.classes.get(class), md.spec.devices.alternatives.get((rank as usize).saturating_sub(1)))
        else {
            continue;
        };
        pools.push(PoolWorkload { pool, class, alternative, replicas: *replicas });
    }
    if pools.is_empty() {
        return Vec::new();
    }
    // The adapters `status.adapters` serves here, by the same check: never one outside its policy.
    let adapters = input.adapters.loadable(cluster);
    render(md, &pools, input.dra.contains(cluster), input.workload_suffix, input.gateways.get(cluster), &adapters)
}

/// The (cluster, pool, desired) a status places replicas at.
fn targets(status: Option<&ModelDeploymentStatus>) -> BTreeSet<(&str, &str, i32)> {
    status
        .iter()
        .flat_map(|s| s.placements.iter())
        .filter(|p| p.desired > 0)
        .map(|p| (p.cluster.as_str(), p.pool.as_str(), p.desired))
        .collect()
}

/// The final status (from the one in effect after the write-ahead), the events and the pace.
fn conclude(
    input: &Input<'_>,
    target: &BTreeMap<Key, i32>,
    step: &BTreeMap<Key, i32>,
    observed: &Observed,
    write_ahead: Option<&ModelDeploymentStatus>,
) -> Outcome {
    let md = input.md;
    let base = write_ahead.or(md.status.as_ref());
    let status = status::desired(base, md.metadata.generation, input.plan, observed, input.now, input.backoff);
    let changed = base != Some(&status);
    let mut events = Vec::new();
    // Compared with the status the reconcile started from, so a write-ahead does not hide the
    // change; nothing when the targets stayed (ready counts moving are not a placement change).
    if (changed || write_ahead.is_some()) && targets(md.status.as_ref()) != targets(Some(&status)) {
        let placed = status.clusters.clone().unwrap_or_else(|| "no placement".into());
        events.push(Note {
            reason: event::PLACEMENT_CHANGED,
            action: "Place",
            message: format!("placement: {placed}"),
            warning: false,
        });
    }
    // Each time more replicas of a pool are found refused by its member's scheduler.
    for p in status.placements.iter().filter(|p| p.unschedulable > 0) {
        let before = md
            .status
            .iter()
            .flat_map(|s| s.placements.iter())
            .find(|q| q.cluster == p.cluster && q.pool == p.pool)
            .map_or(0, |q| q.unschedulable);
        if p.unschedulable > before {
            let word = observed.refused.get(&(p.cluster.clone(), p.pool.clone())).map_or("", |r| r.message.as_str());
            events.push(Note {
                reason: event::REPLICAS_UNSCHEDULABLE,
                action: "Replace",
                message: format!(
                    "{}/{}: the member's scheduler refused {} replica(s) past the grace ({word}); placing them \
                     elsewhere, no more go to this pool while any are refused{}",
                    p.cluster,
                    p.pool,
                    p.unschedulable,
                    status
                        .refused_pools
                        .iter()
                        .find(|r| r.cluster == p.cluster && r.pool == p.pool)
                        .map_or(String::new(), |r| format!(" and not before {}", r.retry_after.0))
                ),
                warning: true,
            });
        }
    }
    let settled = status.ready_replicas >= input.plan.desired as i32
        && observed.unreachable.is_empty()
        && observed.apply_failed.is_empty()
        && step == target;
    let waiting = observed.cache.as_ref().is_some_and(|c| !c.waiting.is_empty());
    let pace = if settled {
        Pace::Settled
    } else if waiting {
        Pace::WaitingForCache
    } else {
        Pace::Converging
    };
    Outcome { status, events, pace }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
