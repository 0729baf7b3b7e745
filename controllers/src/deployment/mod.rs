//! The ModelDeployment reconciler, as observe → decide → apply. Observe: the deployment's
//! entry in the fleet plan (`placement::Replanner` over the informer caches, once per fleet
//! state, off the async workers, re-planning only what a change can reach), its CapacityClaim
//! (`claim_sync.rs`) and what its members run (`observe.rs`). Decide: `decide.rs`, pure — the make-before-break step, the objects per
//! member, the write-ahead status, the final status, events and pace. Apply: the write-ahead,
//! server-side apply and prune per member, the status only when it differs, the events. Which
//! deployments a fleet change concerns is `wake.rs`, driven by `trigger.rs`. A ModelDeployment
//! in a namespace tenants may not use is refused before any of this (`tenant.rs`); its
//! finalizer removes its member objects on deletion (`cleanup.rs`) — and nothing else.

pub mod adapters;
mod claim_sync;
pub mod cleanup;
pub mod crosscheck;
pub mod decide;
pub mod digest;
pub mod members;
pub mod naming;
pub mod observe;
mod retry;
pub mod rollout;
pub mod status;
mod tenant;
pub mod trigger;
pub mod wake;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use flotilla_apis::ModelDeployment;
use flotilla_apis::constants::FINALIZER_MEMBER_CLEANUP;
use flotilla_apis::deployment::ClusterPlacement;
use flotilla_apis::{CapacityClaim, FleetQuota, InferenceClass, InferenceCluster, ModelCache};
use flotilla_placement::{FleetSnapshot, Plan, Replanner, SolveOptions, isolate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::PatchParams;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};

use crate::member::{MemberClients, brief};
use crate::metrics::{Kind, Metrics, Outcome, SolveMode};
use crate::{ControllerConfig, Error};
use decide::Pace;

/// The informer caches ModelDeployment reconciles read.
#[derive(Clone)]
pub struct Stores {
    /// Member clusters.
    pub clusters: Store<InferenceCluster>,
    /// Classes.
    pub classes: Store<InferenceClass>,
    /// ModelCaches (where replicas may start, and solver preference).
    pub caches: Store<ModelCache>,
    /// Every ModelDeployment: the fleet's copy, the one whose changes tick the trigger.
    pub deployments: Store<ModelDeployment>,
    /// CapacityClaims (the one a deployment owns).
    pub claims: Store<CapacityClaim>,
    /// FleetQuotas (limits the plan holds to; empty where the control cluster lacks the kind).
    pub quotas: Store<FleetQuota>,
}

/// The solver's state between solves: the re-planner of the last solve, and the deployments the
/// solver failed on, left out until their spec changes (`flotilla_placement::isolate`).
#[derive(Default)]
struct SolverState {
    replanner: Option<Replanner>,
    quarantine: isolate::Quarantine,
    /// The objects the last solve read (for a re-plan check's reproducer).
    last_objects: Option<crosscheck::FleetObjects>,
    /// Solves so far: a check resolves into the state only if no solve came after it.
    solves: u64,
}

/// What ModelDeployment reconciles share.
pub struct DeploymentContext {
    /// The control cluster.
    pub client: Client,
    /// Member clusters, from a reflector.
    pub clusters: Store<InferenceCluster>,
    /// Classes, from a reflector.
    pub classes: Store<InferenceClass>,
    /// ModelCaches, from a reflector.
    pub caches: Store<ModelCache>,
    /// Every ModelDeployment, from the fleet's reflector (the plan is solved from it).
    pub deployments: Store<ModelDeployment>,
    /// CapacityClaims, from a reflector.
    pub claims: Store<CapacityClaim>,
    /// FleetQuotas.
    pub quotas: Store<FleetQuota>,
    /// Member clients.
    pub members: Arc<MemberClients>,
    /// Metrics.
    pub metrics: Metrics,
    /// Tunables.
    pub config: ControllerConfig,
    /// Event recorder.
    pub recorder: Recorder,
    /// The last plan and the fingerprint of the objects it was solved from: every deployment
    /// reconciled against an unchanged fleet reuses one solve, and reconciles arriving during a
    /// solve wait for it.
    plans: crate::solve_once::SolveOnce<Solved>,
    /// The solver's state after the last solve, which the next one re-plans from: the same plan
    /// `solve` gives, reusing what the change cannot reach (`placement/src/replan.rs`). Taken
    /// by the one solve that runs at a time (`plans`).
    replanner: Arc<std::sync::Mutex<SolverState>>,
    /// What the plan reads, summed up from the watch events (`digest.rs`).
    digest: Arc<digest::Digest>,
    /// The plan each deployment's last reconcile acted on (`wake.rs`).
    pub(crate) acted: wake::Acted,
    /// Refused member writes in a row, per deployment and member: the back-off of `retry.rs`.
    pub(crate) apply_failures: retry::ApplyFailures,
    /// One incremental re-plan in K solved again whole, off the reconciles' path.
    pub crosscheck: Arc<crosscheck::CrossCheck>,
}

impl DeploymentContext {
    /// A context; the recorder reports as `flotilla-controller`. `digest` must be fed every
    /// watch event of the five stores the plan reads (`trigger::Facts` does).
    pub fn new(
        client: Client,
        stores: Stores,
        members: Arc<MemberClients>,
        metrics: Metrics,
        config: ControllerConfig,
        digest: Arc<digest::Digest>,
    ) -> Self {
        let reporter = Reporter { controller: "flotilla-controller".into(), instance: None };
        let recorder = Recorder::new(client.clone(), reporter);
        let crosscheck = Arc::new(crosscheck::CrossCheck::new(
            config.replan_check_every,
            config.replan_check_dir.clone(),
            metrics.clone(),
        ));
        Self {
            client,
            clusters: stores.clusters,
            classes: stores.classes,
            caches: stores.caches,
            deployments: stores.deployments,
            claims: stores.claims,
            quotas: stores.quotas,
            members,
            metrics,
            config,
            recorder,
            plans: Default::default(),
            replanner: Default::default(),
            digest,
            acted: Default::default(),
            apply_failures: Default::default(),
            crosscheck,
        }
    }

    /// The fleet's plan and its sequence number: solved again only when an object the
    /// snapshot reads changed (the solver is deterministic, so the same objects give the same
    /// plan), on a blocking thread, one solve at a time (`SolveOnce`).
    ///
    /// A deployment writing to its status the placements the plan gave it does not solve again:
    /// the plan stays what the solver decided, and once every deployment records it a solve of
    /// the fleet gives the same plan (a re-plan of an unchanged fleet keeps every replica). So
    /// during a burst of a thousand deployments converging, their write-aheads and status writes
    /// do not each queue a solve of the whole fleet; anything else they record (a refusal, a
    /// replica draining, a placement the plan did not give) does.
    ///
    /// Whether anything changed is asked of the digest the watch events keep (`digest.rs`), at a
    /// cost that does not grow with the fleet. With `this` (a reconcile's deployment), a plan
    /// solved from another version of it is not trusted even while the digest lags its store.
    pub async fn solve(&self, this: Option<&ModelDeployment>) -> Result<(u64, Arc<Plan>), Error> {
        // A resolved re-plan divergence moves the key on: the diverged plan is not kept.
        let key = || self.digest.value().wrapping_add(self.crosscheck.epoch().wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let this = this.map(|d| (input_of(d).0, deployment_version(d)));
        let still = |solved: &Solved| {
            this.as_ref().is_none_or(|(uid, version)| solved.versions.get(uid) == Some(version))
                && self.digest.recorded_hold(|uid, recorded| solved.holds_one(uid, recorded))
        };
        let input = || {
            // Everything recorded so far is in the stores this reads.
            self.digest.recorded_read();
            let inputs: Vec<Input> = self.deployments.state().iter().map(|d| input_of(d)).collect();
            (self.objects(), inputs)
        };
        let replanner = self.replanner.clone();
        let metrics = self.metrics.clone();
        let crosscheck = self.crosscheck.clone();
        let compute = move |(objects, inputs): (crosscheck::FleetObjects, Vec<Input>)| {
            let started = Instant::now();
            let snapshot = objects.snapshot();
            let shared = replanner.clone();
            // A solve that panicked left no state to trust: the next one starts whole.
            let mut state = match replanner.lock() {
                Ok(g) => g,
                Err(poisoned) => {
                    let mut g = poisoned.into_inner();
                    g.replanner = None;
                    replanner.clear_poison();
                    g
                }
            };
            let state = &mut *state;
            // The re-plan from the last solve, on the fleet without the deployments the solver
            // failed on; if it fails too (or nothing was solved yet), a whole solve that leaves
            // out whichever deployment it fails on (`isolate`), so that one bad deployment never
            // stops planning for the others.
            let before = state.quarantine.clone();
            let rest = state.quarantine.without(&snapshot);
            let rest_ref = &rest;
            let replanned = state.replanner.take().and_then(|mut r| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                    r.replan(rest_ref);
                    r
                }))
                .ok()
            });
            let r = match replanned {
                Some(r) => r,
                None => {
                    let solve = |s: &FleetSnapshot| Replanner::new(s, SolveOptions::default());
                    // Not one deployment's fault: no plan for anyone (`Error::Solve`).
                    isolate::solve_isolating(&snapshot, &mut state.quarantine, solve)?
                }
            };
            for (deployment, why) in state.quarantine.entries() {
                if !before.entries().any(|(d, _)| d == deployment) {
                    tracing::error!(%deployment, "the solver failed on this deployment ({why}): left out of planning until its spec changes");
                }
            }
            let stats = r.stats();
            let mode = if stats.full { SolveMode::Whole } else { SolveMode::Incremental };
            metrics.solved(mode, started.elapsed(), &stats);
            let sample = (!stats.full && crosscheck.due()).then(|| crosscheck::Sample {
                before: state.last_objects.take(),
                after: objects.clone(),
                snapshot: rest.into_owned(),
                plan: r.plan().clone(),
            });
            state.last_objects = Some(objects);
            state.solves += 1;
            if let Some(sample) = sample {
                let solves = state.solves;
                let whole = |s: &FleetSnapshot| Replanner::new(s, SolveOptions::default());
                crosscheck.spawn(sample, whole, move |whole| {
                    if let Ok(mut st) = shared.lock() {
                        // Solved from the state the check started from: the next re-plan
                        // starts from the whole solve; after a later solve, from nothing.
                        st.replanner = (st.solves == solves).then_some(whole);
                    }
                });
            }
            let mut plan = r.plan().clone();
            plan.deployments.extend(state.quarantine.plans(&snapshot));
            // Each reconcile looks its entry up: by binary search, not a scan of the fleet.
            plan.sort_by_name();
            state.replanner = Some(r);
            Ok(Solved::new(plan, inputs))
        };
        let (seq, solved) = self.plans.get(key, still, input, compute).await.map_err(Error::Solve)?;
        Ok((seq, solved.plan.clone()))
    }

    /// The plan a reconcile of `namespace/name` acts on, recorded as such (`wake::Acted`).
    pub async fn plan_for(&self, md: &ModelDeployment) -> Result<Arc<Plan>, Error> {
        let solved = self.solve(Some(md)).await?;
        Ok(self.acted.act_on((md.namespace().unwrap_or_else(|| "default".into()), md.name_any()), solved))
    }

    /// The objects a solve reads, from which it builds the same snapshot `fleetctl plan --live`
    /// builds: without the clusters being deleted (their deletion policy decides what stays
    /// there) and the deployments the controller refuses (they take no capacity).
    fn objects(&self) -> crosscheck::FleetObjects {
        let tenancy = &self.config.tenancy;
        let mut clusters = self.clusters.state();
        clusters.retain(|c| c.metadata.deletion_timestamp.is_none());
        let mut deployments = self.deployments.state();
        deployments.retain(|d| tenancy.check("ModelDeployment", &d.namespace().unwrap_or_default()).is_ok());
        let quotas = self.quotas.state();
        crosscheck::FleetObjects {
            classes: self.classes.state(),
            clusters,
            caches: self.caches.state(),
            deployments,
            quotas,
        }
    }
}

/// A fleet plan with what each deployment's status recorded when it was solved and what the
/// plan gives it, both as [`recorded`] hashes them, by uid: the plan still holds while every
/// deployment records one or the other (`DeploymentContext::solve`).
pub(crate) struct Solved {
    plan: Arc<Plan>,
    recorded: HashMap<String, (u64, u64)>,
    /// Each deployment's version (`deployment_version`) as solved, by uid.
    versions: HashMap<String, u64>,
}

/// A deployment as a solve saw it: its uid (its `namespace/name` when it has none), its
/// `namespace/name` (the plan's key), its recorded placements as [`recorded`] hashes them, and
/// its version (`deployment_version`).
type Input = (String, String, u64, u64);

fn input_of(d: &ModelDeployment) -> Input {
    let name = format!("{}/{}", d.namespace().unwrap_or_else(|| "default".into()), d.name_any());
    (d.metadata.uid.clone().unwrap_or_else(|| name.clone()), name, recorded_of(d), deployment_version(d))
}

impl Solved {
    /// `plan`, solved from deployments whose placements were `inputs`.
    fn new(plan: Plan, inputs: Vec<Input>) -> Self {
        let planned: HashMap<String, u64> = plan
            .deployments
            .iter()
            .map(|p| {
                let placements: Vec<ClusterPlacement> = p.assignments.iter().map(|a| a.to_placement(0)).collect();
                (format!("{}/{}", p.namespace, p.name), recorded(placements.iter().map(recorded_placement)))
            })
            .collect();
        let versions = inputs.iter().map(|(key, _, _, version)| (key.clone(), *version)).collect();
        let recorded = inputs
            .into_iter()
            .map(|(key, name, input, _)| {
                let planned = planned.get(&name).copied().unwrap_or(input);
                (key, (input, planned))
            })
            .collect();
        Self { plan: Arc::new(plan), recorded, versions }
    }

    /// Whether the plan still holds for the deployment `uid` recording `now`: what it recorded
    /// when the plan was solved, or what the plan gives it.
    fn holds_one(&self, uid: &str, now: u64) -> bool {
        self.recorded.get(uid).is_some_and(|(input, planned)| now == *input || now == *planned)
    }

    #[cfg(test)]
    /// Whether the plan still holds for these deployments (the fingerprint aside): each records
    /// the placements it had when the plan was solved, or those the plan gives it.
    fn holds<'a>(&self, deployments: impl IntoIterator<Item = &'a ModelDeployment>) -> bool {
        // Looked up by uid without building a name: this runs on every reconcile, over every
        // deployment, under the plan cache's lock.
        deployments.into_iter().all(|d| match d.metadata.uid.as_deref() {
            Some(uid) => self.holds_one(uid, recorded_of(d)),
            None => self.holds_one(&input_of(d).0, recorded_of(d)),
        })
    }
}

fn recorded_of(d: &ModelDeployment) -> u64 {
    recorded(d.status.iter().flat_map(|s| &s.placements).map(recorded_placement))
}

/// A status placement as the solver reads it: cluster, pool, class, capacity type, rank,
/// desired and unschedulable (not ready counts).
type Recorded<'a> = (&'a str, &'a str, &'a str, &'static str, i32, i32, i32);

fn recorded_placement(p: &ClusterPlacement) -> Recorded<'_> {
    (&p.cluster, &p.pool, &p.class, p.capacity_type.as_str(), p.fallback_rank, p.desired, p.unschedulable)
}

/// A hash of a deployment's placements as the solver reads them, in any order.
fn recorded<'a>(placements: impl Iterator<Item = Recorded<'a>>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut items: Vec<Recorded<'a>> = placements.collect();
    items.sort_unstable();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    items.hash(&mut h);
    h.finish()
}

/// What the plan reads of an object whose status the controller writes from the plan (a
/// FleetQuota), for the digest: its `generation` and whether it is being deleted — a status
/// write of its own must not solve again.
pub fn spec_seen(m: &kube::api::ObjectMeta) -> digest::Seen {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (m.generation.unwrap_or_default(), m.deletion_timestamp.is_some()).hash(&mut h);
    let id = m.uid.clone().unwrap_or_else(|| {
        format!("{}/{}", m.namespace.as_deref().unwrap_or_default(), m.name.as_deref().unwrap_or_default())
    });
    digest::Seen { id, version: h.finish(), recorded: None }
}

/// What the plan reads of a class, cluster or cache, for the digest: its resource version and
/// whether it is being deleted. (Of a deployment, `deployment_seen`: its spec's `generation` and
/// its backed-off pools, not its `resourceVersion`: ready counts, conditions and events written
/// to a deployment's status during convergence do not move the plan, so they do not solve it
/// again. The placements its status records are compared apart, `Solved`.)
pub fn meta_seen(m: &kube::api::ObjectMeta) -> digest::Seen {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (m.resource_version.as_deref().unwrap_or_default(), m.deletion_timestamp.is_some()).hash(&mut h);
    let id = m.uid.clone().unwrap_or_else(|| {
        format!("{}/{}", m.namespace.as_deref().unwrap_or_default(), m.name.as_deref().unwrap_or_default())
    });
    digest::Seen { id, version: h.finish(), recorded: None }
}

/// What the plan reads of a deployment: its spec (generation), the pools it is backed off from
/// and whether it is being deleted; not its other status writes.
fn deployment_version(d: &ModelDeployment) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    d.metadata.generation.unwrap_or(0).hash(&mut h);
    for r in d.status.iter().flat_map(|s| &s.refused_pools) {
        (&r.cluster, &r.pool, r.devices_short).hash(&mut h);
    }
    d.metadata.deletion_timestamp.is_some().hash(&mut h);
    h.finish()
}

/// A deployment for the digest: its version, and the placements it records (compared apart).
pub fn deployment_seen(d: &ModelDeployment) -> digest::Seen {
    let (id, _, recorded, version) = input_of(d);
    digest::Seen { id, version, recorded: Some(recorded) }
}

/// Reconciles one ModelDeployment (with its finalizer).
pub async fn reconcile(md: Arc<ModelDeployment>, ctx: Arc<DeploymentContext>) -> Result<Action, Error> {
    tracing::debug!(deployment = %md.name_any(), "reconcile");
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER_MEMBER_CLEANUP, md, |ev| async {
        match ev {
            Finalizer::Apply(md) => apply(md, ctx.clone()).await,
            Finalizer::Cleanup(md) => cleanup::cleanup(md, ctx.clone()).await,
        }
    })
    .await
    .map_err(crate::from_finalizer)
}

/// Observe (plan entry, claim, members, caches of the model and adapters, classes), decide (`decide.rs`), apply
/// (write-ahead, members, status, events).
async fn apply(md: Arc<ModelDeployment>, ctx: Arc<DeploymentContext>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let name = md.name_any();
    let who = format!("{ns}/{name}");
    if let Err(why) = ctx.config.tenancy.check("ModelDeployment", &ns) {
        return tenant::refuse(&ctx, &md, &why).await;
    }
    // The plan is solved from the kind's one store, which this object was read from too: a
    // newer version there arrived while this reconcile started, and has its own reconcile
    // queued; this one would act on a plan entry of the newer spec.
    // Gone from the store: deleted meanwhile, nothing to apply.
    let Some(fleet_copy) = ctx.deployments.get(&ObjectRef::from_obj(md.as_ref())) else {
        return Ok(Action::await_change());
    };
    if fleet_copy.resource_version() != md.resource_version() {
        tracing::debug!(deployment = %who, "a newer version arrived meanwhile; its own reconcile follows");
        return Ok(Action::requeue(ctx.config.poll));
    }
    let plan = ctx.plan_for(&md).await?;
    let Some(dp) = plan.get(&ns, &name) else {
        return Ok(Action::requeue(ctx.config.poll));
    };
    let involved = decide::involved(&md, dp);
    // An invalid spec asks nothing of members or of a provider (`decide` touches none).
    let (claim, members) = if dp.invalid.is_none() {
        let claim = claim_sync::sync_claim(&ctx, &md, dp).await;
        (claim, observe::observe_members(&ctx, &md, &involved).await)
    } else {
        (None, observe::Members::default())
    };
    tracing::debug!(deployment = %who, running = ?members.seen.running, unreachable = ?members.seen.unreachable, "observed members");
    let cache = md.spec.model.cache_ref.as_ref().map(|r| cache_view(&ctx, &ns, r));
    let adapters = adapter_view(&ctx, &md, &involved);
    let classes: BTreeMap<String, _> = ctx.classes.state().iter().map(|c| (c.name_any(), c.spec.clone())).collect();
    let dra: BTreeSet<String> = ctx
        .clusters
        .state()
        .iter()
        .filter(|c| c.status.as_ref().and_then(|s| s.dra).unwrap_or(false))
        .map(|c| c.name_any())
        .collect();
    let gateways: BTreeMap<String, _> =
        ctx.clusters.state().iter().filter_map(|c| Some((c.name_any(), c.spec.gateway_ref.clone()?))).collect();
    let now = Time(Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now()));
    // Pools of every InferenceCluster (read only for a deployment with an older neighbour whose
    // name extends its own): where its names could meet another's.
    let pools = || ctx.clusters.state().iter().flat_map(|c| c.spec.pools.iter().map(|p| p.name.clone())).collect();
    let workload_suffix = naming::suffix(&md, ctx.deployments.state().iter().map(|d| d.as_ref()), pools);
    let input = decide::Input {
        md: &md,
        workload_suffix: workload_suffix.as_deref(),
        plan: dp,
        seen: &members.seen,
        claim: claim.as_deref(),
        cache: cache.as_ref(),
        adapters: &adapters,
        classes: &classes,
        dra: &dra,
        gateways: &gateways,
        now: &now,
        backoff: ctx.config.unschedulable_backoff,
    };
    let decision = decide::decide(&input);

    // Write-ahead, then the members, then the final status over what the write-ahead left.
    let (mut base_status, mut base_rv) = (md.status.clone(), md.resource_version());
    if let Some(ahead) = &decision.write_ahead
        && let Some(written) = write_status(&ctx, &md, base_status.as_ref(), base_rv.clone(), ahead).await?
    {
        tracing::debug!(deployment = %who, "recorded before applying");
        base_rv = written.resource_version();
        base_status = written.status;
    }
    let (failed, conflicts) = write_members(&ctx, &md, &members, &decision.members).await;
    let outcome = decision.after_failures(&input, &failed, &conflicts);
    let wrote = write_status(&ctx, &md, base_status.as_ref(), base_rv, &outcome.status).await?.is_some();
    let changed = wrote || decision.write_ahead.is_some();
    if changed {
        tracing::info!(
            deployment = %who,
            ready = outcome.status.ready_replicas,
            placements = outcome.status.clusters.as_deref().unwrap_or(""),
            "status updated"
        );
    }
    for note in &outcome.events {
        let ev = Event {
            type_: if note.warning { EventType::Warning } else { EventType::Normal },
            reason: note.reason.into(),
            note: Some(note.message.clone()),
            action: note.action.into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&ev, &md.object_ref(&())).await {
            tracing::debug!(deployment = %who, error = %brief(&e), "event not recorded");
        }
    }
    ctx.metrics.reconciled(
        Kind::ModelDeployment,
        if changed { Outcome::Changed } else { Outcome::Unchanged },
        started.elapsed(),
    );
    let next = match outcome.pace {
        Pace::AwaitChange => None,
        Pace::Settled => Some(ctx.config.poll * SETTLED_POLLS),
        Pace::WaitingForCache => Some(ctx.config.poll),
        Pace::Converging => Some(Duration::from_secs(2).min(ctx.config.poll)),
    };
    // A back-off that ends brings the pool back to the solver: look again then (the status
    // written drops it, which solves the fleet anew).
    let backoff_ends = outcome
        .status
        .refused_pools
        .iter()
        .map(|r| Duration::from_secs((r.retry_after.0.as_second() - now.0.as_second()).max(0) as u64 + 1))
        .min();
    Ok(match next.into_iter().chain(backoff_ends).min() {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// A settled deployment is looked at again after this many polls: the safety net. Changes of
/// the fleet (its plan entry, its cache, its clusters' reachability) wake it at once
/// (`trigger.rs`); what only members show (a hand edit, a pod lost) waits for this.
pub const SETTLED_POLLS: u32 = 12;

/// The deployment's ModelCache as the reflector holds it.
fn cache_view(ctx: &DeploymentContext, ns: &str, name: &str) -> decide::CacheView {
    let cache = ctx.caches.get(&ObjectRef::new(name).within(ns));
    decide::CacheView {
        name: format!("{ns}/{name}"),
        exists: cache.is_some(),
        phases: cache
            .iter()
            .flat_map(|c| c.status.iter().flat_map(|s| s.clusters.iter()))
            .map(|c| (c.cluster.clone(), (c.phase, c.reason.clone())))
            .collect(),
    }
}

/// The deployment's adapters with their ModelCaches and the `involved` clusters (every cluster
/// its status can place it in), as the reflectors hold them; empty without adapters.
fn adapter_view(ctx: &DeploymentContext, md: &ModelDeployment, involved: &BTreeSet<String>) -> adapters::AdapterView {
    if md.spec.adapters.is_empty() {
        return adapters::AdapterView::default();
    }
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let places = involved
        .iter()
        .filter_map(|c| Some((c.clone(), adapters::Place::of(ctx.clusters.get(&ObjectRef::new(c))?.as_ref()))))
        .collect();
    adapters::AdapterView::of(
        md,
        |name| ctx.caches.get(&ObjectRef::new(name).within(&ns)).map(|c| adapters::AdapterCache::of(&c)),
        places,
    )
}

/// Applies each member's objects and prunes the rest of the deployment's objects there.
/// Returns the members where that failed, with why, and those where names were taken by
/// objects that are not this deployment's (left alone), naming them.
async fn write_members(
    ctx: &DeploymentContext,
    md: &ModelDeployment,
    members: &observe::Members,
    objects: &BTreeMap<String, Vec<serde_json::Value>>,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    use futures_util::StreamExt;
    let who = trigger::namespaced_key(md);
    ctx.apply_failures.keep_only(&who, objects.keys());
    let (who_ref, members_ref) = (&who, members);
    let names: Vec<String> = objects.keys().cloned().collect();
    let outcomes: Vec<(String, Written)> = futures_util::stream::iter(names)
        .map(|cluster| async move {
            let written = match objects.get(&cluster) {
                Some(these) => write_member(ctx, md, who_ref, members_ref, &cluster, these).await,
                None => Written::Skipped,
            };
            (cluster, written)
        })
        .buffered(observe::MEMBERS_AT_ONCE)
        .collect()
        .await;
    let mut failed = BTreeMap::new();
    let mut conflicts = BTreeMap::new();
    let mut writes = 0usize;
    for (cluster, outcome) in outcomes {
        match outcome {
            Written::Skipped => {}
            Written::Done(n, left_alone) => {
                writes += n;
                if !left_alone.is_empty() {
                    conflicts.insert(cluster, left_alone.join("; "));
                }
            }
            Written::Refused(refusal) => {
                failed.insert(cluster, refusal);
            }
        }
    }
    if writes > 0 {
        tracing::info!(deployment = %who, writes, "member workloads updated");
    }
    (failed, conflicts)
}

/// What writing one member did.
enum Written {
    /// The member did not answer the observation: nothing written.
    Skipped,
    /// Objects written or deleted, and names left alone (taken by objects not this deployment's).
    Done(usize, Vec<String>),
    /// The member refused (now, or recently: `retry.rs` waits before writing again).
    Refused(String),
}

/// Applies one member's objects and prunes the rest of the deployment's objects there.
async fn write_member(
    ctx: &DeploymentContext,
    md: &ModelDeployment,
    who: &str,
    members: &observe::Members,
    cluster: &str,
    objects: &[serde_json::Value],
) -> Written {
    let Some((client, state)) = members.answered.get(cluster) else { return Written::Skipped };
    // A member that keeps refusing is written to less and less often (`retry.rs`); its last
    // refusal stands in the status meanwhile.
    if let Some(refusal) = ctx.apply_failures.waiting(who, cluster, Instant::now()) {
        return Written::Refused(refusal);
    }
    let result = async {
        let stamp = members::Stamp { install: &ctx.config.install_id, cluster };
        let a = members::apply(client, md, &ctx.config.field_manager, stamp, objects, state).await?;
        members::report_drift(&ctx.recorder, md, cluster, &a.drifted).await;
        let install = &ctx.config.install_id;
        let d = members::prune(client, md, install, &members::ids(objects), ctx.config.timeouts.observe).await?;
        Ok::<(usize, Vec<String>), kube::Error>((a.written + d, a.conflicts))
    }
    .await;
    let (now, cap) = (Instant::now(), ctx.config.poll * SETTLED_POLLS);
    match result {
        Ok((n, left_alone)) => {
            if !left_alone.is_empty() {
                tracing::warn!(deployment = %who, cluster, objects = ?left_alone, "names taken by objects that are not this deployment's: left alone");
            }
            let streak = ctx.apply_failures.record(who, cluster, None, now, cap);
            if streak.before > 0 {
                tracing::info!(deployment = %who, cluster, after = streak.before, "the member took the deployment's objects again");
            }
            Written::Done(n, left_alone)
        }
        Err(e) => {
            let refusal = brief(&e);
            if ctx.apply_failures.record(who, cluster, Some(&refusal), now, cap).now == 1 {
                tracing::warn!(deployment = %who, cluster, %refusal, "the member refused the deployment's objects; retrying with back-off");
            }
            Written::Refused(refusal)
        }
    }
}

/// Writes `next` over `current` (the status as of `resource_version`) through the one
/// conditional helper: nothing when equal; conditional on the resourceVersion, because a merge
/// patch replaces the whole conditions list and a write based on a stale copy would drop a
/// condition another writer (the gateway's `Serving`) added since. Returns the written object.
pub(crate) async fn write_status(
    ctx: &DeploymentContext,
    md: &ModelDeployment,
    current: Option<&flotilla_apis::deployment::ModelDeploymentStatus>,
    resource_version: Option<String>,
    next: &flotilla_apis::deployment::ModelDeploymentStatus,
) -> Result<Option<ModelDeployment>, Error> {
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default());
    let pp = PatchParams::apply(&ctx.config.field_manager);
    let written = crate::status_patch::write_status(&api, &md.name_any(), current, resource_version, next, &pp).await?;
    if written.is_some() {
        ctx.metrics.status_write(Kind::ModelDeployment);
    }
    Ok(written)
}

#[cfg(test)]
mod plan_cache_tests {
    use super::digest::{Digest, Part};
    use super::{Solved, deployment_seen, input_of, meta_seen};
    use flotilla_apis::ModelDeployment;
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::Event;

    fn meta(uid: &str, rv: &str) -> ObjectMeta {
        ObjectMeta { uid: Some(uid.into()), resource_version: Some(rv.into()), ..Default::default() }
    }

    /// A deployment at `generation`, with one placement of `desired` replicas, `ready` of them
    /// ready, as its status records.
    fn dep(uid: &str, rv: &str, generation: i64, desired: i32, ready: i32) -> ModelDeployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": uid, "namespace": "ml", "uid": uid, "resourceVersion": rv, "generation": generation},
            "spec": {"model": {"name": "m", "source": "hf://o/m"}, "replicas": 2, "engine": {"image": "i"},
                     "topology": {"type": "TensorParallel", "devicesPerReplica": 1},
                     "devices": {"alternatives": [{"class": "h100"}]}},
            "status": {"readyReplicas": ready, "placements": [{"cluster": "eu1", "pool": "h100", "class": "h100",
                "capacityType": "on-demand", "fallbackRank": 1, "desired": desired, "ready": ready, "serving": ready}]}
        }))
        .unwrap()
    }

    /// The digest of these objects, fed as watch events in this order.
    fn fingerprint<'a>(
        classes: impl Iterator<Item = &'a ObjectMeta>,
        clusters: impl Iterator<Item = &'a ObjectMeta>,
        caches: impl Iterator<Item = &'a ObjectMeta>,
        deployments: impl Iterator<Item = &'a ModelDeployment>,
    ) -> u64 {
        let d = Digest::default();
        for (part, metas) in [
            (Part::Class, classes.collect::<Vec<_>>()),
            (Part::Cluster, clusters.collect()),
            (Part::Cache, caches.collect()),
        ] {
            for m in metas {
                d.event(part, &Event::Apply(m.clone()), meta_seen);
            }
        }
        for dep in deployments {
            d.event(Part::Deployment, &Event::Apply(dep.clone()), deployment_seen);
        }
        d.value()
    }

    #[test]
    fn the_plan_is_solved_again_exactly_when_an_input_object_changed() {
        let classes = [meta("c1", "1")];
        let clusters = [meta("k1", "5"), meta("k2", "6")];
        let deps = [dep("d1", "9", 1, 2, 0), dep("d2", "10", 1, 2, 0)];
        let key = |clusters: &[ObjectMeta], deps: &[ModelDeployment]| {
            fingerprint(classes.iter(), clusters.iter(), [].iter(), deps.iter())
        };
        let base = key(&clusters, &deps);
        let reordered = [meta("k2", "6"), meta("k1", "5")];
        assert_eq!(key(&reordered, &deps), base, "store order does not matter");
        assert_ne!(key(&[meta("k1", "5"), meta("k2", "7")], &deps), base, "a cluster status changed");
        assert_ne!(key(&clusters, &deps[..1]), base, "a deployment went away");
        let mut deleting = deps.clone();
        deleting[1].metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
        assert_ne!(key(&clusters, &deleting), base, "a deployment is being deleted");
        // What the solver reads of a deployment: its spec (generation), its backed-off pools;
        // its placements are compared apart (the next test).
        assert_ne!(key(&clusters, &[dep("d1", "11", 2, 2, 0), deps[1].clone()]), base, "a spec changed");
        let mut backed_off = deps.clone();
        backed_off[0].status.as_mut().unwrap().refused_pools = vec![flotilla_apis::deployment::RefusedPool {
            cluster: "eu1".into(),
            pool: "h100".into(),
            retry_after: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
            devices_short: true,
            message: String::new(),
        }];
        assert_ne!(key(&clusters, &backed_off), base, "a pool was backed off");
        // Not what it does not read: a status write of ready counts (a new resourceVersion).
        assert_eq!(key(&clusters, &[dep("d1", "12", 1, 2, 2), deps[1].clone()]), base, "ready counts moved only");
        // The same uid under another kind is another input.
        assert_ne!(
            fingerprint([].iter(), classes.iter(), [].iter(), [].iter()),
            fingerprint(classes.iter(), [].iter(), [].iter(), [].iter())
        );
    }

    #[test]
    fn a_plan_holds_while_deployments_record_what_it_gave_them_and_no_longer_otherwise() {
        use flotilla_placement::plan::{Assignment, DeploymentPlan, Plan};
        // Solved when d1 recorded nothing yet and d2 ran 2 on eu1; the plan gives d1 2 on eu1.
        let mut fresh = dep("d1", "9", 1, 2, 0);
        fresh.status.as_mut().unwrap().placements.clear();
        let d2 = dep("d2", "10", 1, 2, 2);
        let assignment = |replicas: u32| Assignment {
            cluster: "eu1".into(),
            pool: "h100".into(),
            class: "h100".into(),
            capacity_type: flotilla_apis::CapacityType::OnDemand,
            fallback_rank: 1,
            replicas,
            cost_micros_per_hour: 0,
        };
        let entry = |name: &str, replicas: u32| DeploymentPlan {
            namespace: "ml".into(),
            name: name.into(),
            assignments: vec![assignment(replicas)],
            ..Default::default()
        };
        let plan = Plan { deployments: vec![entry("d1", 2), entry("d2", 2)], ..Plan::default() };
        let inputs = [&fresh, &d2].iter().map(|d| input_of(d)).collect();
        let solved = Solved::new(plan, inputs);
        assert!(solved.holds([&fresh, &d2]), "nothing changed");
        // d1 writes ahead what the plan gave it (ready 0, then 2): still the same plan.
        assert!(solved.holds([&dep("d1", "11", 1, 2, 0), &d2]));
        assert!(solved.holds([&dep("d1", "12", 1, 2, 2), &d2]), "ready counts are not read");
        // Twins: anything else the status records solves again.
        assert!(!solved.holds([&dep("d1", "11", 1, 1, 0), &d2]), "a placement the plan did not give");
        let mut refused = dep("d1", "11", 1, 2, 0);
        refused.status.as_mut().unwrap().placements[0].unschedulable = 1;
        assert!(!solved.holds([&refused, &d2]), "a replica was refused");
        let mut draining = dep("d1", "11", 1, 2, 0);
        let mut old = draining.status.as_ref().unwrap().placements[0].clone();
        (old.cluster, old.desired) = ("us1".into(), 0);
        draining.status.as_mut().unwrap().placements.push(old);
        assert!(!solved.holds([&draining, &d2]), "a replica draining elsewhere");
        assert!(!solved.holds([&fresh, &d2, &dep("d3", "13", 1, 2, 0)]), "a deployment the plan has not seen");
    }
}
