//! The CapacityClaim reconciler. Observe: the claim, its last status, the classes. Decide: the
//! providers crate's `ClaimEngine::step` (pure apart from calls through the provider), which
//! walks capacity types × device classes × allowed regions and records every attempt. Apply:
//! for simulated clouds, the nodes the provider "provisioned" become kwok nodes in the
//! member; status is written only when the step changed it. The `capacity-release` finalizer
//! gives everything back (and removes those nodes) before the claim goes.
//! `sizing` decides, for a ModelDeployment, which claim it should own.

pub mod nodes;
pub mod providerfile;
pub mod simfile;
pub mod sizing;
pub mod usage;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_apis::constants::FINALIZER_CAPACITY_RELEASE;
use flotilla_apis::{CapacityClaim, InferenceClass, InferenceCluster};
use flotilla_providers::claim::autoscaler_may_remove;
use flotilla_providers::{Acquisition, CapacityProvider, ClaimEngine, ClaimInput, ClaimStep, ClaimUsage, RegionInfo};
use k8s_openapi::jiff::Timestamp;
use kube::api::PatchParams;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use crate::member::{MemberClients, brief};
use crate::metrics::{Kind, Metrics};
use crate::{ControllerConfig, Error};

/// What claim reconciles share.
pub struct ClaimContext {
    /// The control cluster.
    pub client: Client,
    /// The provider claims are solved against.
    pub provider: Arc<dyn CapacityProvider>,
    /// The engine.
    pub engine: ClaimEngine,
    /// Classes.
    pub classes: Store<InferenceClass>,
    /// Member clusters.
    pub clusters: Store<InferenceCluster>,
    /// Member clients.
    pub members: Arc<MemberClients>,
    /// Whether acquisitions' nodes are created in members (simulated clouds).
    pub materialize: bool,
    /// Metrics.
    pub metrics: Metrics,
    /// Tunables.
    pub config: ControllerConfig,
}

/// Reconciles one CapacityClaim (with its finalizer).
pub async fn reconcile(claim: Arc<CapacityClaim>, ctx: Arc<ClaimContext>) -> Result<Action, Error> {
    let ns = claim.namespace().unwrap_or_else(|| "default".into());
    let api: Api<CapacityClaim> = Api::namespaced(ctx.client.clone(), &ns);
    if claim.metadata.deletion_timestamp.is_some() && claim.finalizers().iter().any(|f| f == FINALIZER_CAPACITY_RELEASE)
    {
        // `scaleDown: ApplicationDrainOnly`: nothing is released while the application runs there.
        let seen = Look::at(&ctx, &claim).await;
        if let Some(step) = ctx.engine.hold_for_drain(seen.input(&claim, &BTreeMap::new())) {
            write_status(&ctx, &claim, &step).await?;
            return Ok(Action::requeue(step.requeue_after));
        }
    }
    finalizer(&api, FINALIZER_CAPACITY_RELEASE, claim, |ev| async {
        match ev {
            Finalizer::Apply(c) => apply(c, ctx.clone()).await,
            Finalizer::Cleanup(c) => cleanup(c, ctx.clone()).await,
        }
    })
    .await
    .map_err(crate::from_finalizer)
}

fn key(claim: &CapacityClaim) -> String {
    flotilla_apis::names::owner_key(&claim.namespace().unwrap_or_default(), &claim.name_any())
}

/// What one look at a claim reads besides the classes: its status (default when none) and
/// what its nodes run.
struct Look {
    namespace: String,
    name: String,
    status: flotilla_apis::claim::CapacityClaimStatus,
    usage: ClaimUsage,
}

impl Look {
    async fn at(ctx: &ClaimContext, claim: &CapacityClaim) -> Self {
        let status = claim.status.clone().unwrap_or_default();
        let usage = usage(ctx, claim, &status).await;
        Self { namespace: claim.namespace().unwrap_or_else(|| "default".into()), name: claim.name_any(), status, usage }
    }

    /// The engine's input, now (to the second).
    fn input<'a>(
        &'a self,
        claim: &'a CapacityClaim,
        classes: &'a BTreeMap<String, flotilla_apis::class::InferenceClassSpec>,
    ) -> ClaimInput<'a> {
        ClaimInput {
            namespace: &self.namespace,
            name: &self.name,
            generation: claim.metadata.generation,
            created: claim.metadata.creation_timestamp.as_ref().map_or_else(Timestamp::now, |t| t.0),
            spec: &claim.spec,
            status: &self.status,
            classes,
            usage: &self.usage,
            now: whole_seconds(),
        }
    }
}

async fn apply(claim: Arc<CapacityClaim>, ctx: Arc<ClaimContext>) -> Result<Action, Error> {
    let (ns, name) = (claim.namespace().unwrap_or_else(|| "default".into()), claim.name_any());
    if let Err(why) = ctx.config.tenancy.check("CapacityClaim", &ns) {
        return refuse(&ctx, &claim, &why).await;
    }
    let classes: BTreeMap<String, _> = ctx.classes.state().iter().map(|c| (c.name_any(), c.spec.clone())).collect();
    let seen = Look::at(&ctx, &claim).await;
    let step = ctx.engine.step(seen.input(&claim, &classes), ctx.provider.as_ref()).await;
    let mut requeue = step.requeue_after;
    if ctx.materialize
        && let Err(e) = materialize(&ctx, &key(&claim), &step.acquisitions).await
    {
        tracing::warn!(claim = %format!("{ns}/{name}"), error = %e, "provisioned nodes not (all) created; retrying");
        requeue = requeue.min(Duration::from_secs(2));
    }
    write_status(&ctx, &claim, &step).await?;
    Ok(Action::requeue(requeue.max(Duration::from_millis(500))))
}

/// A claim in a namespace tenants may not use: `Fulfilled`, `Provisioning` and `Ready` say so
/// with `InvalidSpec`, and no provider is asked for anything. What it already holds stays (a
/// refusal tears nothing down); deleting the claim releases it as usual.
async fn refuse(ctx: &ClaimContext, claim: &CapacityClaim, why: &str) -> Result<Action, Error> {
    let status = refused_status(claim, why, &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(whole_seconds()));
    if claim.status.as_ref() != Some(&status) && write(ctx, claim, &status).await? {
        tracing::warn!(claim = %key(claim), "refused: {why}");
    }
    Ok(Action::await_change())
}

/// The status of a refused claim: its last status with the refusal's conditions merged in.
fn refused_status(
    claim: &CapacityClaim,
    why: &str,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> flotilla_apis::claim::CapacityClaimStatus {
    let mut next = claim.status.clone().unwrap_or_default();
    next.observed_generation = claim.metadata.generation;
    next.conditions.0 = flotilla_apis::conditions::merge(
        &next.conditions.0,
        &crate::tenancy::refused(&crate::tenancy::CLAIM_REFUSED, why),
        claim.metadata.generation,
        now,
    );
    next
}

/// Now, to the second: the API server keeps condition and attempt times to the second, so a
/// finer `now` would make the first status differ from what is read back and write again.
fn whole_seconds() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now())
}

/// Writes `status` over the claim's (conditional on its resourceVersion), counting the write;
/// whether anything was written.
async fn write(
    ctx: &ClaimContext,
    claim: &CapacityClaim,
    status: &flotilla_apis::claim::CapacityClaimStatus,
) -> Result<bool, Error> {
    let api: Api<CapacityClaim> =
        Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_else(|| "default".into()));
    let pp = PatchParams::apply(&ctx.config.field_manager);
    let written = crate::status_patch::write_status(
        &api,
        &claim.name_any(),
        claim.status.as_ref(),
        claim.resource_version(),
        status,
        &pp,
    )
    .await?;
    if written.is_some() {
        ctx.metrics.status_write(Kind::CapacityClaim);
    }
    Ok(written.is_some())
}

/// Writes `step.status` when the step changed it (conditional on the claim's resourceVersion).
async fn write_status(ctx: &ClaimContext, claim: &CapacityClaim, step: &ClaimStep) -> Result<(), Error> {
    if !step.changed || !write(ctx, claim, &step.status).await? {
        return Ok(());
    }
    let (ns, name) = (claim.namespace().unwrap_or_else(|| "default".into()), claim.name_any());
    let line = |t: &str| step.status.conditions.get(t).map(|c| (c.reason.clone(), c.message.clone()));
    let (reason, message) = line(flotilla_apis::constants::condition::FULFILLED).unwrap_or_default();
    let (surplus, surplus_message) = line(flotilla_apis::constants::condition::SURPLUS).unwrap_or_default();
    tracing::info!(claim = %format!("{ns}/{name}"), %reason, %message, %surplus, %surplus_message, "claim status updated");
    Ok(())
}

/// The claim's nodes and their application pods in every member its provider's regions map to
/// (members that do not answer are left out: their pods are unknown), marking each node
/// do-not-disrupt for node autoscalers unless the claim lets it go.
async fn usage(
    ctx: &ClaimContext,
    claim: &CapacityClaim,
    status: &flotilla_apis::claim::CapacityClaimStatus,
) -> ClaimUsage {
    let claim_key = key(claim);
    let now = Timestamp::now();
    let protect = |acquisition: &str| {
        let since = status.allocations.iter().find(|a| a.pool == acquisition).and_then(|a| a.since.as_ref());
        since.is_none() || !autoscaler_may_remove(&claim.spec, since.map(|t| t.0), now)
    };
    let mut out = ClaimUsage::default();
    let mut clusters: Vec<String> = ctx.provider.regions().into_iter().map(|r| r.cluster).collect();
    clusters.sort();
    clusters.dedup();
    for cluster in clusters {
        let Some(ic) = ctx.clusters.state().into_iter().find(|c| c.name_any() == cluster) else { continue };
        let client = match ctx.members.client(&ctx.client, &ic, ctx.config.timeouts).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(claim = %claim_key, %cluster, error = %e, "claim nodes not observed");
                continue;
            }
        };
        let t = ctx.config.timeouts;
        let seen = match ctx.members.watch(&cluster, &client, t).await {
            Ok(w) => w.observation(t).await,
            Err(e) => Err(e),
        };
        match seen {
            Ok(seen) => {
                let nodes = usage::observe(&client, &seen, &claim_key, &ctx.config.field_manager, protect).await;
                out.clusters.insert(cluster);
                out.nodes.extend(nodes);
            }
            Err(e) => tracing::debug!(claim = %claim_key, %cluster, error = %e, "claim nodes not observed"),
        }
    }
    out
}

/// The member pool of `class` in `cluster` (the first declared pool of that class).
fn pool_of(cluster: &InferenceCluster, class: &str) -> Option<String> {
    cluster.spec.pools.iter().find(|p| p.class == class).map(|p| p.name.clone())
}

/// Create (and delete) the nodes of `claim` in every member its provider's regions map to.
async fn materialize(ctx: &ClaimContext, claim: &str, acquisitions: &[Acquisition]) -> Result<(), String> {
    let regions: Vec<RegionInfo> = ctx.provider.regions();
    let mut problems = Vec::new();
    for region in &regions {
        let Some(ic) = ctx.clusters.state().into_iter().find(|c| c.name_any() == region.cluster) else {
            continue;
        };
        let mine: Vec<Acquisition> = acquisitions.iter().filter(|a| a.region == region.name).cloned().collect();
        let wanted = nodes::wanted(&mine);
        let client = match ctx.members.client(&ctx.client, &ic, ctx.config.timeouts).await {
            Ok(c) => c,
            Err(e) => {
                problems.push(format!("{}: {e}", region.cluster));
                continue;
            }
        };
        let result = tokio::time::timeout(
            ctx.config.timeouts.observe,
            nodes::sync(&client, claim, &region.name, &wanted, |class| pool_of(&ic, class)),
        )
        .await;
        match result {
            Ok(Ok(n)) if n > 0 => {
                tracing::info!(claim, cluster = %region.cluster, writes = n, "provisioned nodes synced")
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => problems.push(format!("{}: {}", region.cluster, brief(&e))),
            Err(_) => problems.push(format!("{}: did not answer in time", region.cluster)),
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

async fn cleanup(claim: Arc<CapacityClaim>, ctx: Arc<ClaimContext>) -> Result<Action, Error> {
    let status = claim.status.clone().unwrap_or_default();
    let failed = ctx.engine.release_all(&key(&claim), &status, ctx.provider.as_ref()).await;
    if ctx.materialize
        && let Err(e) = materialize(&ctx, &key(&claim), &[]).await
    {
        return Err(Error::Finalizer(format!("removing the claim's nodes: {e}")));
    }
    if !failed.is_empty() {
        let what: Vec<String> = failed.iter().map(|(id, e)| format!("{id}: {e}")).collect();
        return Err(Error::Finalizer(format!("releasing capacity: {}", what.join("; "))));
    }
    tracing::info!(claim = %key(&claim), allocations = status.allocations.len(), "capacity released");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_apis::claim::ClaimAllocation;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_refused_claim_says_why_asks_for_nothing_and_keeps_what_it_holds() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fleet/claims.yaml")).unwrap();
        let mut claim: CapacityClaim = serde_yaml_ng::from_str(&text).unwrap();
        claim.metadata.namespace = Some("kube-system".into());
        claim.metadata.generation = Some(3);
        let held = ClaimAllocation { pod_set: "p".into(), cluster: "eu1".into(), nodes: 2, ..Default::default() };
        claim.status =
            Some(flotilla_apis::claim::CapacityClaimStatus { allocations: vec![held.clone()], ..Default::default() });
        let tenancy = crate::tenancy::Tenancy::new(["flotilla-system".to_string()], []);
        let why = tenancy.check("CapacityClaim", "kube-system").unwrap_err();
        let status = refused_status(&claim, &why, &Time(Timestamp::from_second(1_800_000_000).unwrap()));
        for t in crate::tenancy::CLAIM_REFUSED {
            let c = status.conditions.get(t).unwrap();
            assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "InvalidSpec"), "{t}");
            assert!(c.message.contains("namespace kube-system is protected"), "{}", c.message);
        }
        assert_eq!(status.allocations, [held], "a refusal releases nothing");
        assert!(status.attempts.is_empty(), "and asks no provider");
        assert_eq!(status.observed_generation, Some(3));
        // An allowed namespace is not refused: the engine runs as before.
        assert!(tenancy.check("CapacityClaim", "ml").is_ok());
    }
}
