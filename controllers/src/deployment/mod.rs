//! The ModelDeployment reconciler. Observe: a fleet snapshot from the informer caches and the
//! workloads each member runs. Decide: `placement::solve`, then a make-before-break step
//! toward the plan, then the rendered objects per member. Apply: server-side apply where
//! something changed, prune what is no longer wanted, write status only when it differs.
//! A ModelDeployment in a namespace tenants may not use is refused before any of this
//! (`tenant.rs`); its finalizer removes its member objects on deletion (`cleanup.rs`) — and
//! nothing else.

pub mod cleanup;
pub mod members;
pub mod rollout;
pub mod status;
mod tenant;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use flotilla_apis::ModelDeployment;
use flotilla_apis::cache::CachePhase;
use flotilla_apis::constants::{FINALIZER_MEMBER_CLEANUP, condition, event};
use flotilla_apis::{CapacityClaim, InferenceClass, InferenceCluster, ModelCache};
use flotilla_placement::plan::DeploymentPlan;
use flotilla_placement::{FleetSnapshot, SolveOptions, solve};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};

use crate::claim::sizing::ClaimDecision;
use crate::member::{MemberClients, brief};
use crate::metrics::{Kind, Metrics, Outcome};
use crate::render::{PoolWorkload, render};
use crate::{ControllerConfig, Error};
use rollout::Key;

/// What ModelDeployment reconciles share.
pub struct DeploymentContext {
    /// The control cluster.
    pub client: Client,
    /// Member clusters, from a reflector.
    pub clusters: Store<InferenceCluster>,
    /// Classes, from a reflector.
    pub classes: Store<InferenceClass>,
    /// ModelCaches, from a reflector (where replicas may start, and solver preference).
    pub caches: Store<ModelCache>,
    /// Every ModelDeployment, from the controller's reflector.
    pub deployments: Store<ModelDeployment>,
    /// Member clients.
    pub members: Arc<MemberClients>,
    /// Metrics.
    pub metrics: Metrics,
    /// Tunables.
    pub config: ControllerConfig,
    /// Event recorder.
    pub recorder: Recorder,
    /// The last plan and the fingerprint of the objects it was solved from: every deployment
    /// reconciled against an unchanged fleet (a tick reconciles them all) reuses one solve,
    /// and reconciles arriving during a solve wait for it.
    plans: crate::solve_once::SolveOnce<flotilla_placement::Plan>,
}

impl DeploymentContext {
    /// A context; the recorder reports as `flotilla-controller`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        clusters: Store<InferenceCluster>,
        classes: Store<InferenceClass>,
        caches: Store<ModelCache>,
        deployments: Store<ModelDeployment>,
        members: Arc<MemberClients>,
        metrics: Metrics,
        config: ControllerConfig,
    ) -> Self {
        let reporter = Reporter { controller: "flotilla-controller".into(), instance: None };
        let recorder = Recorder::new(client.clone(), reporter);
        Self {
            client,
            clusters,
            classes,
            caches,
            deployments,
            members,
            metrics,
            config,
            recorder,
            plans: Default::default(),
        }
    }

    /// The fleet's plan: solved again only when an object the snapshot reads changed (the
    /// solver is deterministic, so the same objects give the same plan), on a blocking thread,
    /// one solve at a time (`SolveOnce`).
    async fn plan(&self) -> Result<Arc<flotilla_placement::Plan>, Error> {
        let key = || {
            fingerprint(
                self.classes.state().iter().map(|o| &o.metadata),
                self.clusters.state().iter().map(|o| &o.metadata),
                self.caches.state().iter().map(|o| &o.metadata),
                self.deployments.state().iter().map(|o| &o.metadata),
            )
        };
        self.plans
            .get(key, || self.snapshot(), |snapshot| solve(&snapshot, &SolveOptions::default()))
            .await
            .map_err(Error::Solve)
    }

    /// The same snapshot `fleetctl plan --live` builds from the same objects.
    /// Without the clusters being deleted (their deletion policy decides what stays there) and
    /// the deployments the controller refuses (they take no capacity).
    fn snapshot(&self) -> FleetSnapshot {
        let tenancy = &self.config.tenancy;
        FleetSnapshot::from_live(
            self.classes.state().iter().map(|c| c.as_ref().clone()),
            self.clusters
                .state()
                .iter()
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .map(|c| c.as_ref().clone()),
            self.caches.state().iter().map(|c| c.as_ref().clone()),
            self.deployments
                .state()
                .iter()
                .filter(|d| tenancy.check("ModelDeployment", &d.namespace().unwrap_or_default()).is_ok())
                .map(|d| d.as_ref().clone()),
        )
    }

    fn cache(&self, namespace: &str, name: &str) -> Option<Arc<ModelCache>> {
        self.caches.state().into_iter().find(|c| c.namespace().as_deref() == Some(namespace) && c.name_any() == name)
    }

    fn cluster(&self, name: &str) -> Option<Arc<InferenceCluster>> {
        self.clusters.state().into_iter().find(|c| c.name_any() == name)
    }
}

/// A fingerprint of the objects a fleet snapshot is built from: each one's uid,
/// resourceVersion and whether it is being deleted, per kind, in a fixed order.
fn fingerprint<'a>(
    classes: impl Iterator<Item = &'a kube::api::ObjectMeta>,
    clusters: impl Iterator<Item = &'a kube::api::ObjectMeta>,
    caches: impl Iterator<Item = &'a kube::api::ObjectMeta>,
    deployments: impl Iterator<Item = &'a kube::api::ObjectMeta>,
) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (kind, metas) in [
        ("class", classes.collect::<Vec<_>>()),
        ("cluster", clusters.collect()),
        ("cache", caches.collect()),
        ("deployment", deployments.collect()),
    ] {
        let mut keys: Vec<(&str, &str, bool)> = metas
            .iter()
            .map(|m| {
                (
                    m.uid.as_deref().unwrap_or(""),
                    m.resource_version.as_deref().unwrap_or(""),
                    m.deletion_timestamp.is_some(),
                )
            })
            .collect();
        keys.sort_unstable();
        (kind, keys).hash(&mut h);
    }
    h.finish()
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

async fn apply(md: Arc<ModelDeployment>, ctx: Arc<DeploymentContext>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let name = md.name_any();
    if let Err(why) = ctx.config.tenancy.check("ModelDeployment", &ns) {
        return tenant::refuse(&ctx, &md, &why).await;
    }
    tracing::debug!(deployment = %format!("{ns}/{name}"), "planning");
    let plan = ctx.plan().await?;
    let Some(dp) = plan.get(&ns, &name).cloned() else {
        return Ok(Action::requeue(ctx.config.poll));
    };
    if let Some(invalid) = &dp.invalid {
        // A spec that cannot be used changes nothing on members and asks no provider for
        // capacity: only its status says why, and the next spec change reconciles it.
        let next = status::invalid(md.status.as_ref(), md.metadata.generation, invalid, &Time(Timestamp::now()));
        if md.status.as_ref() != Some(&next) {
            write_status(&ctx, &md, md.status.as_ref(), md.resource_version(), &next).await?;
        }
        return Ok(Action::await_change());
    }
    let target: BTreeMap<Key, i32> =
        dp.assignments.iter().map(|a| ((a.cluster.clone(), a.pool.clone()), a.replicas as i32)).collect();
    let claim = sync_claim(&ctx, &md, &dp).await;

    // Observe every member that runs or should run something of this deployment.
    let mut involved: BTreeSet<String> = target.keys().map(|k| k.0.clone()).collect();
    if let Some(s) = &md.status {
        involved.extend(s.placements.iter().map(|p| p.cluster.clone()));
    }
    let mut observed = status::Observed { claim, ..Default::default() };
    let mut states: BTreeMap<String, (crate::member::Handle, members::MemberState)> = BTreeMap::new();
    for cluster in &involved {
        let Some(ic) = ctx.cluster(cluster) else {
            observed.unreachable.insert(cluster.clone(), "no such InferenceCluster".into());
            observed.vanished.insert(cluster.clone());
            continue;
        };
        // Its deletion policy, not this reconcile, decides what happens to the objects there.
        if ic.metadata.deletion_timestamp.is_some() {
            observed.unreachable.insert(cluster.clone(), "its InferenceCluster is being deleted".into());
            continue;
        }
        let member = match ctx.members.handle(&ctx.client, &ic, ctx.config.timeouts).await {
            Ok(m) => m,
            Err(e) => {
                observed.unreachable.insert(cluster.clone(), e.to_string());
                continue;
            }
        };
        match members::observe(&member, &md, ctx.config.timeouts.observe).await {
            Ok(state) => {
                for (pool, r) in &state.running {
                    observed.running.insert((cluster.clone(), pool.clone()), *r);
                }
                states.insert(cluster.clone(), (member, state));
            }
            Err(e) => {
                observed.unreachable.insert(cluster.clone(), e.to_string());
            }
        }
    }

    tracing::debug!(deployment = %format!("{ns}/{name}"), ?observed.running, ?observed.unreachable, "observed members");
    // Decide the next step and apply it where members answered.
    let desired_total = dp.desired as i32;
    let mut next = rollout::step(&target, &observed.running, desired_total);
    // Replicas start only where the referenced ModelCache is Ready.
    if let Some(cache_ref) = &md.spec.model.cache_ref {
        let cache = ctx.cache(&ns, cache_ref);
        let phase = |cluster: &str| -> Option<(CachePhase, Option<String>)> {
            let s = cache.as_ref()?.status.as_ref()?;
            s.clusters.iter().find(|c| c.cluster == cluster).map(|c| (c.phase, c.reason.clone()))
        };
        let running: BTreeMap<Key, rollout::Running> =
            observed.running.iter().filter(|(k, _)| states.contains_key(&k.0)).map(|(k, v)| (k.clone(), *v)).collect();
        let held =
            rollout::gate_on_cache(&mut next, &running, |c| phase(c).is_some_and(|(p, _)| p == CachePhase::Ready));
        let waiting = held
            .into_iter()
            .map(|c| {
                let what = match (cache.is_some(), phase(&c)) {
                    (false, _) => "the ModelCache does not exist".to_string(),
                    (true, None) => "not staged there yet".to_string(),
                    (true, Some((CachePhase::Failed, Some(r)))) => format!("Failed: {r}"),
                    (true, Some((p, _))) => format!("{p:?}"),
                };
                (c, what)
            })
            .collect();
        observed.cache = Some(status::CacheWait { cache: format!("{ns}/{cache_ref}"), waiting });
    }
    // Write-ahead: a cluster about to get this deployment's objects is recorded in status
    // first. Status placements are what later reconciles observe, prune and clean up; objects
    // created where no landed status names them (the status write after them lost a conflict)
    // would run on, unobserved, forever.
    let (mut base_status, mut base_rv) = (md.status.clone(), md.resource_version());
    let mut wrote_ahead = false;
    let recorded: BTreeSet<&str> =
        md.status.iter().flat_map(|s| s.placements.iter()).map(|p| p.cluster.as_str()).collect();
    let fresh: BTreeSet<&str> = next
        .iter()
        .filter(|(k, r)| **r > 0 && states.contains_key(&k.0) && !recorded.contains(k.0.as_str()))
        .map(|(k, _)| k.0.as_str())
        .collect();
    if !fresh.is_empty() {
        let ahead =
            status::desired(md.status.as_ref(), md.metadata.generation, &dp, &observed, &Time(Timestamp::now()));
        if fresh.iter().all(|c| ahead.placements.iter().any(|p| p.cluster == *c)) {
            let written = write_status(&ctx, &md, base_status.as_ref(), base_rv.clone(), &ahead).await?;
            tracing::debug!(deployment = %format!("{ns}/{name}"), clusters = ?fresh, "recorded before applying");
            base_rv = written.resource_version();
            base_status = written.status;
            wrote_ahead = true;
        }
    }
    let classes: BTreeMap<String, _> = ctx.classes.state().iter().map(|c| (c.name_any(), c.spec.clone())).collect();
    let mut writes = 0usize;
    for (cluster, (client, state)) in &states {
        let mut pools: Vec<PoolWorkload<'_>> = Vec::new();
        for ((c, pool), replicas) in &next {
            if c != cluster || *replicas <= 0 {
                continue;
            }
            let Some(a) = dp
                .assignments
                .iter()
                .find(|a| a.cluster == *c && a.pool == *pool)
                .map(|a| (a.class.clone(), a.fallback_rank))
                .or_else(|| {
                    md.status
                        .as_ref()?
                        .placements
                        .iter()
                        .find(|p| p.cluster == *c && p.pool == *pool)
                        .map(|p| (p.class.clone(), p.fallback_rank.max(1) as u32))
                })
            else {
                continue;
            };
            let (Some(class), Some(alt)) =
                (classes.get(&a.0), md.spec.devices.alternatives.get((a.1 as usize).saturating_sub(1)))
            else {
                continue;
            };
            pools.push(PoolWorkload { pool, class, alternative: alt, replicas: *replicas });
        }
        // Members that publish DRA devices get ResourceClaims with the solver's selectors.
        let dra = ctx.cluster(cluster).and_then(|c| c.status.as_ref()?.dra).unwrap_or(false);
        let objects = if pools.is_empty() { Vec::new() } else { render(&md, &pools, dra) };
        let result = async {
            let a = members::apply(client, &md, &ctx.config.field_manager, &objects, state).await?;
            members::report_drift(&ctx.recorder, &md, cluster, &a.drifted).await;
            let d = members::prune(client, &md, &members::ids(&objects), ctx.config.timeouts.observe).await?;
            Ok::<usize, kube::Error>(a.written + d)
        }
        .await;
        match result {
            Ok(n) => writes += n,
            Err(e) => {
                observed.apply_failed.insert(cluster.clone(), brief(&e));
            }
        }
    }
    if writes > 0 {
        tracing::info!(deployment = %format!("{ns}/{name}"), writes, "member workloads updated");
    }

    // Status, written only when it changes.
    let now = Time(Timestamp::now());
    let next_status = status::desired(base_status.as_ref(), md.metadata.generation, &dp, &observed, &now);
    let changed = base_status.as_ref() != Some(&next_status);
    // The event compares with the status this reconcile started from, so a write-ahead does
    // not hide the change from it.
    if changed || wrote_ahead {
        let old_targets: BTreeSet<(String, String, i32)> = md
            .status
            .as_ref()
            .map(|s| {
                s.placements
                    .iter()
                    .filter(|p| p.desired > 0)
                    .map(|p| (p.cluster.clone(), p.pool.clone(), p.desired))
                    .collect()
            })
            .unwrap_or_default();
        let new_targets: BTreeSet<(String, String, i32)> = next_status
            .placements
            .iter()
            .filter(|p| p.desired > 0)
            .map(|p| (p.cluster.clone(), p.pool.clone(), p.desired))
            .collect();
        if changed {
            write_status(&ctx, &md, base_status.as_ref(), base_rv, &next_status).await?;
        }
        tracing::info!(
            deployment = %format!("{ns}/{name}"),
            ready = next_status.ready_replicas,
            placements = next_status.clusters.as_deref().unwrap_or(""),
            "status updated"
        );
        if old_targets != new_targets {
            let note = next_status.clusters.clone().unwrap_or_else(|| "no placement".into());
            let _ = ctx
                .recorder
                .publish(
                    &Event {
                        type_: EventType::Normal,
                        reason: event::PLACEMENT_CHANGED.into(),
                        note: Some(format!("placement: {note}")),
                        action: "Place".into(),
                        secondary: None,
                    },
                    &md.object_ref(&()),
                )
                .await;
        }
    }
    ctx.metrics.reconciled(
        Kind::ModelDeployment,
        if changed || wrote_ahead { Outcome::Changed } else { Outcome::Unchanged },
        started.elapsed(),
    );
    let settled = next_status.ready_replicas >= desired_total && observed.unreachable.is_empty() && next == target;
    // Waiting for a cache needs no fast polling: its status changing triggers a reconcile.
    let waiting = observed.cache.as_ref().is_some_and(|c| !c.waiting.is_empty());
    Ok(Action::requeue(if settled {
        ctx.config.poll * 3
    } else if waiting {
        ctx.config.poll
    } else {
        Duration::from_secs(2).min(ctx.config.poll)
    }))
}

/// Writes `next` over `current` (the status as of `resource_version`). The resourceVersion
/// makes the write conditional: a merge patch replaces the whole conditions list, so a write
/// based on a stale copy would drop a condition another writer (the gateway's `Serving`) added
/// since. A conflict requeues with fresh data.
async fn write_status(
    ctx: &DeploymentContext,
    md: &ModelDeployment,
    current: Option<&flotilla_apis::deployment::ModelDeploymentStatus>,
    resource_version: Option<String>,
    next: &flotilla_apis::deployment::ModelDeploymentStatus,
) -> Result<ModelDeployment, Error> {
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default());
    let mut patch = crate::status_patch::status_patch(current, next).map_err(kube::Error::SerdeError)?;
    patch["metadata"] = serde_json::json!({"resourceVersion": resource_version});
    let written =
        api.patch_status(&md.name_any(), &PatchParams::apply(&ctx.config.field_manager), &Patch::Merge(&patch)).await?;
    ctx.metrics.status_write(Kind::ModelDeployment);
    Ok(written)
}

/// Create, update or delete the CapacityClaim the deployment owns (`claim::sizing` decides).
/// Returns the claim's `namespace/name` while one exists. A claim of the same name that the
/// deployment does not own is never touched.
async fn sync_claim(ctx: &DeploymentContext, md: &ModelDeployment, dp: &DeploymentPlan) -> Option<String> {
    md.spec.placement.capacity_claim_template.as_ref()?;
    // Without a provider nothing would act on a claim: the deployment keeps saying
    // InsufficientCapacity instead of pointing at a claim nobody handles.
    ctx.config.capacity.as_ref()?;
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let name = md.name_any();
    let who = format!("{ns}/{name}");
    let api: Api<CapacityClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = match api.get_opt(&name).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(deployment = %who, error = %brief(&e), "could not read its CapacityClaim");
            return None;
        }
    };
    if let Some(c) = &existing
        && !c.owner_references().iter().any(|o| Some(&o.uid) == md.metadata.uid.as_ref())
    {
        tracing::warn!(deployment = %who, "a CapacityClaim of the same name exists and is not this deployment's: left alone");
        return None;
    }
    // A new claim only once every member's capacity has been observed: right after a start, a
    // fleet not yet looked at would otherwise look empty and buy capacity it has.
    let observed_all = ctx
        .clusters
        .state()
        .iter()
        .all(|c| c.status.as_ref().is_some_and(|s| s.conditions.get(condition::CAPACITY_KNOWN).is_some()));
    match crate::claim::sizing::decide(md, dp, existing.as_ref()) {
        ClaimDecision::None => existing.map(|_| who),
        ClaimDecision::Apply(_) if existing.is_none() && (!observed_all || !short_for_a_while(md)) => {
            tracing::debug!(deployment = %who, "not claiming capacity yet: members unobserved or the shortfall is new");
            None
        }
        ClaimDecision::Apply(claim) => {
            let pods: i32 = claim.spec.pod_sets.iter().map(|p| p.count).sum();
            match api.patch(&name, &PatchParams::apply(&ctx.config.field_manager).force(), &Patch::Apply(&*claim)).await
            {
                Ok(_) => {
                    tracing::info!(deployment = %who, pods, "CapacityClaim applied for replicas the fleet cannot place");
                    let _ = ctx
                        .recorder
                        .publish(
                            &Event {
                                type_: EventType::Normal,
                                reason: event::CAPACITY_REQUESTED.into(),
                                note: Some(format!("CapacityClaim {who} asks for {pods} pod(s) of capacity")),
                                action: "Claim".into(),
                                secondary: None,
                            },
                            &md.object_ref(&()),
                        )
                        .await;
                    Some(who)
                }
                Err(e) => {
                    tracing::warn!(deployment = %who, error = %brief(&e), "CapacityClaim not applied");
                    existing.map(|_| who)
                }
            }
        }
        ClaimDecision::Delete => {
            if let Err(e) = api.delete(&name, &Default::default()).await {
                tracing::warn!(deployment = %who, error = %brief(&e), "CapacityClaim not deleted");
                return Some(who);
            }
            tracing::info!(deployment = %who, "CapacityClaim deleted: the deployment needs no extra capacity");
            None
        }
    }
}

/// How long replicas must have been unplaced (`Placed=False` in status) before a new claim asks a
/// provider for capacity: a shortfall seen while members are still being observed, or while
/// another deployment is shrinking, must not buy nodes.
pub const CLAIM_AFTER: Duration = Duration::from_secs(15);

fn short_for_a_while(md: &ModelDeployment) -> bool {
    let Some(placed) = md.status.as_ref().and_then(|s| s.conditions.get(condition::PLACED).cloned()) else {
        return false;
    };
    let since = Timestamp::now().duration_since(placed.last_transition_time.0);
    placed.status == "False" && since.as_secs() >= CLAIM_AFTER.as_secs() as i64
}

#[cfg(test)]
mod plan_cache_tests {
    use super::fingerprint;
    use kube::api::ObjectMeta;

    fn meta(uid: &str, rv: &str) -> ObjectMeta {
        ObjectMeta { uid: Some(uid.into()), resource_version: Some(rv.into()), ..Default::default() }
    }

    #[test]
    fn the_plan_is_solved_again_exactly_when_an_input_object_changed() {
        let classes = [meta("c1", "1")];
        let clusters = [meta("k1", "5"), meta("k2", "6")];
        let deps = [meta("d1", "9"), meta("d2", "10")];
        let key = |clusters: &[ObjectMeta], deps: &[ObjectMeta]| {
            fingerprint(classes.iter(), clusters.iter(), [].iter(), deps.iter())
        };
        let base = key(&clusters, &deps);
        let reordered = [meta("k2", "6"), meta("k1", "5")];
        assert_eq!(key(&reordered, &deps), base, "store order does not matter");
        assert_ne!(key(&[meta("k1", "5"), meta("k2", "7")], &deps), base, "a cluster status changed");
        assert_ne!(key(&clusters, &deps[..1]), base, "a deployment went away");
        let mut deleting = deps.clone();
        deleting[1].deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
        assert_ne!(key(&clusters, &deleting), base, "a deployment is being deleted");
        // The same uid under another kind is another input.
        assert_ne!(
            fingerprint([].iter(), classes.iter(), [].iter(), [].iter()),
            fingerprint(classes.iter(), [].iter(), [].iter(), [].iter())
        );
    }
}
