//! The ModelCache reconciler. Observe: the target clusters (selector and the named
//! deployments' placements, from the informer caches) and, in each, the volume claim, the
//! staging Job and its pods. Decide: the objects each member needs (`render.rs`) and each
//! cluster's phase from what the Job reported (`status.rs`). Apply: create what is missing —
//! the Job only once per spec, so a deployment scaling out never downloads again — and write
//! status only when it differs, conditional on `resourceVersion`. A finalizer removes the
//! members' volume claims and Jobs on deletion (`cleanup.rs`: only members that held them
//! are waited for). A cache in a namespace tenants may not use is refused (`InvalidSpec`) and
//! touches no member; one whose `credentialsRef` names another namespace is refused
//! (`CredentialsOutsideNamespace`, `credentials.rs`) before any Secret is read.

pub mod cleanup;
pub mod credentials;
pub mod members;
pub mod render;
pub mod status;
pub mod wake;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_apis::cache::{CachePhase, ClusterCacheStatus, ModelCacheStatus};
use flotilla_apis::constants::{FINALIZER_CACHE_CLEANUP, reason};
use flotilla_apis::{InferenceCluster, ModelCache, ModelDeployment};
use futures_util::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::PatchParams;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use crate::member::{MemberClients, brief};
use crate::metrics::{Kind, Metrics, Outcome};
use crate::{ControllerConfig, Error};
use status::Observation;

/// What ModelCache reconciles share.
pub struct CacheContext {
    /// The control cluster.
    pub client: Client,
    /// Every ModelCache, from its reflector (for the wake-ups).
    pub caches: Store<ModelCache>,
    /// Member clusters, from a reflector.
    pub clusters: Store<InferenceCluster>,
    /// Every ModelDeployment, from a reflector.
    pub deployments: Store<ModelDeployment>,
    /// Member clients.
    pub members: Arc<MemberClients>,
    /// Metrics.
    pub metrics: Metrics,
    /// Tunables.
    pub config: ControllerConfig,
}

impl CacheContext {
    fn live_deployments(&self) -> Vec<Arc<ModelDeployment>> {
        self.deployments.state().into_iter().filter(|d| d.metadata.deletion_timestamp.is_none()).collect()
    }
}

/// Reconciles one ModelCache (with its finalizer, through kube-runtime's helper like every kind).
pub async fn reconcile(cache: Arc<ModelCache>, ctx: Arc<CacheContext>) -> Result<Action, Error> {
    let api = api(&ctx, &cache);
    finalizer(&api, FINALIZER_CACHE_CLEANUP, cache, |ev| async {
        match ev {
            Finalizer::Apply(cache) => apply(cache, &ctx).await,
            Finalizer::Cleanup(cache) => cleanup::cleanup(cache, &ctx).await,
        }
    })
    .await
    .map_err(crate::from_finalizer)
}

async fn apply(cache: Arc<ModelCache>, ctx: &CacheContext) -> Result<Action, Error> {
    let started = Instant::now();
    if let Err(why) = ctx.config.tenancy.check("ModelCache", &cache.namespace().unwrap_or_default()) {
        return refuse(ctx, &cache, &why).await;
    }
    // A cluster being deleted is left to its deletion policy.
    let clusters: Vec<Arc<InferenceCluster>> =
        ctx.clusters.state().into_iter().filter(|c| c.metadata.deletion_timestamp.is_none()).collect();
    let deployments = ctx.live_deployments();
    let cluster_refs: Vec<&InferenceCluster> = clusters.iter().map(AsRef::as_ref).collect();
    let dep_refs: Vec<&ModelDeployment> = deployments.iter().map(AsRef::as_ref).collect();
    let targets = status::targets(&cache, &cluster_refs, &dep_refs);
    let previous: BTreeMap<String, ClusterCacheStatus> =
        cache.status.iter().flat_map(|s| s.clusters.iter().cloned()).map(|c| (c.cluster.clone(), c)).collect();

    // The source's credentials, read in the cache's own namespace only and copied to each member.
    let ns = cache.namespace().unwrap_or_else(|| "default".into());
    let secret = match credentials::secret_to_read(&cache) {
        Ok(s) => s,
        Err(why) => return refuse_credentials(ctx, &cache, &clusters, &why).await,
    };
    let mut blocked: Option<ClusterCacheStatus> = None;
    let mut secret_data = None;
    if let Some(key) = &secret {
        let unreadable = |forbidden| ClusterCacheStatus {
            phase: CachePhase::Failed,
            reason: Some(reason::SOURCE_UNAUTHORIZED.into()),
            message: Some(credentials::unreadable(key, forbidden)),
            ..Default::default()
        };
        match members::credentials(&ctx.client, &key.0, &key.1).await {
            Ok(Some(d)) => secret_data = Some(d),
            Ok(None) => blocked = Some(unreadable(false)),
            Err(kube::Error::Api(e)) if e.code == 403 => blocked = Some(unreadable(true)),
            Err(e) => return Err(e.into()),
        }
    }

    // Every target at once, at most MEMBERS_AT_ONCE members at a time, each bounded by its
    // timeout: one slow member delays this cache by its timeout, not by the others' sum.
    let (mut entries, writes): (Vec<ClusterCacheStatus>, usize) = match &blocked {
        Some(b) => (targets.iter().map(|name| ClusterCacheStatus { cluster: name.clone(), ..b.clone() }).collect(), 0),
        None => {
            let (c, cl, secret) = (cache.as_ref(), clusters.as_slice(), secret_data.as_ref());
            let names: Vec<String> = targets.iter().cloned().collect();
            let staged: Vec<(Observation, usize)> = futures_util::stream::iter(names)
                .map(|name| async move { stage_in(ctx, c, cl, &name, secret).await })
                .buffered(MEMBERS_AT_ONCE)
                .collect()
                .await;
            let writes = staged.iter().map(|s| s.1).sum();
            let entries = targets
                .iter()
                .zip(&staged)
                .map(|(name, (observation, _))| status::cluster_status(&cache, name, observation, previous.get(name)))
                .collect();
            (entries, writes)
        }
    };
    // Clusters no longer targeted: remove the objects there unless a deployment still mounts them.
    let users = status::users(&cache, &dep_refs, &cluster_refs);
    let left: Vec<&ClusterCacheStatus> =
        previous.iter().filter(|(name, _)| !targets.contains(*name)).map(|(_, prev)| prev).collect();
    let (c, cl, users) = (cache.as_ref(), clusters.as_slice(), &users);
    let names: Vec<String> = left.iter().map(|prev| prev.cluster.clone()).collect();
    let removed: Vec<bool> = futures_util::stream::iter(names)
        .map(|name| async move { !users.contains_key(&name) && remove_in(ctx, c, cl, &name).await.is_ok() })
        .buffered(MEMBERS_AT_ONCE)
        .collect()
        .await;
    entries.extend(left.into_iter().zip(removed).filter(|(_, removed)| !removed).map(|(prev, _)| prev.clone()));
    if writes > 0 {
        tracing::info!(cache = %format!("{ns}/{}", cache.name_any()), writes, "member volumes and Jobs updated");
    }
    let next = status::desired(&cache, &targets, entries, None, &now());
    let changed = write_status(ctx, &cache, next.clone()).await?;
    ctx.metrics.reconciled(
        Kind::ModelCache,
        if changed { Outcome::Changed } else { Outcome::Unchanged },
        started.elapsed(),
    );
    let settled = next.clusters.iter().all(|c| matches!(c.phase, CachePhase::Ready | CachePhase::Failed));
    Ok(Action::requeue(if settled { ctx.config.poll * 3 } else { Duration::from_secs(2).min(ctx.config.poll) }))
}

/// A cache in a namespace tenants may not use: `Accepted`, `Staged` and `Ready` say so with
/// `InvalidSpec`, and no member is touched.
async fn refuse(ctx: &CacheContext, cache: &ModelCache, why: &str) -> Result<Action, Error> {
    let mut next = cache.status.clone().unwrap_or_default();
    next.observed_generation = cache.metadata.generation;
    next.conditions.0 = flotilla_apis::conditions::merge(
        &next.conditions.0,
        &crate::tenancy::refused(&crate::tenancy::CACHE_REFUSED, why),
        cache.metadata.generation,
        &now(),
    );
    if write_status(ctx, cache, next).await? {
        tracing::warn!(cache = %cache.name_any(), "refused: {why}");
    }
    Ok(Action::await_change())
}

/// A cache whose `credentialsRef` names another namespace: `Accepted`, `Staged` and `Ready`
/// say so with `CredentialsOutsideNamespace`; no Secret is read, nothing is written to a
/// member, and the credentials copy an earlier version may have made is deleted from the
/// members in its status (best effort; volumes, Jobs and replicas are left as they are).
async fn refuse_credentials(
    ctx: &CacheContext,
    cache: &ModelCache,
    clusters: &[Arc<InferenceCluster>],
    why: &str,
) -> Result<Action, Error> {
    for entry in cache.status.iter().flat_map(|s| &s.clusters) {
        let Ok((client, _)) = member_client(ctx, clusters, &entry.cluster).await else { continue };
        let removed = tokio::time::timeout(
            ctx.config.timeouts.observe,
            members::remove_credentials(&client, cache, &ctx.config.install_id),
        );
        if let Ok(Ok(true)) = removed.await {
            tracing::warn!(cache = %cache.name_any(), cluster = %entry.cluster, "credentials copy removed");
        }
    }
    let mut next = cache.status.clone().unwrap_or_default();
    next.observed_generation = cache.metadata.generation;
    next.conditions.0 = flotilla_apis::conditions::merge(
        &next.conditions.0,
        &credentials::refused(why),
        cache.metadata.generation,
        &now(),
    );
    if write_status(ctx, cache, next).await? {
        tracing::warn!(cache = %cache.name_any(), "refused: {why}");
    }
    Ok(Action::await_change())
}

fn api(ctx: &CacheContext, cache: &ModelCache) -> Api<ModelCache> {
    Api::namespaced(ctx.client.clone(), &cache.namespace().unwrap_or_else(|| "default".into()))
}

fn now() -> Time {
    Time(Timestamp::now())
}

async fn member_client(
    ctx: &CacheContext,
    clusters: &[Arc<InferenceCluster>],
    name: &str,
) -> Result<(Client, Arc<InferenceCluster>), String> {
    member_handle(ctx, clusters, name).await.map(|(h, ic)| (h.client, ic))
}

async fn member_handle(
    ctx: &CacheContext,
    clusters: &[Arc<InferenceCluster>],
    name: &str,
) -> Result<(crate::member::Handle, Arc<InferenceCluster>), String> {
    let Some(ic) = clusters.iter().find(|c| c.name_any() == name).cloned() else {
        return Err("no such InferenceCluster".into());
    };
    let handle = ctx.members.handle(&ctx.client, &ic, ctx.config.timeouts).await.map_err(|e| e.to_string())?;
    // The sweep lists the ModelCache kinds only in members where they may be: here they may.
    handle.objects.cache_kinds_touched();
    Ok((handle, ic))
}

/// How many members one cache reconcile observes and writes at the same time.
pub const MEMBERS_AT_ONCE: usize = 8;

/// Observes one member, applies what it lacks, and returns what was observed and how many
/// objects it wrote.
async fn stage_in(
    ctx: &CacheContext,
    cache: &ModelCache,
    clusters: &[Arc<InferenceCluster>],
    name: &str,
    secret: Option<&BTreeMap<String, String>>,
) -> (Observation, usize) {
    let (member, ic) = match member_handle(ctx, clusters, name).await {
        Ok(c) => c,
        Err(e) => return (Observation::Unreachable(e), 0),
    };
    let client = member.client.clone();
    let work = async {
        let mut observed =
            members::observe(&member, cache, &ctx.config.install_id, ctx.config.timeouts.observe).await?;
        let class = render::storage_class(cache, ic.spec.cache_storage_class_name.as_deref());
        let mut objects = vec![render::pvc(cache, class.as_deref())];
        if let Some(data) = secret {
            objects.push(render::credentials_secret(cache, data));
        }
        objects.push(render::job(cache, &ctx.config.stage_image, ctx.config.stage_instance_metadata));
        // The member answered: a refused write is a finding about it, not unreachability.
        let n = match members::apply(
            &client,
            &ctx.config.field_manager,
            crate::deployment::members::Stamp { install: &ctx.config.install_id, cluster: name },
            &objects,
            &observed,
        )
        .await
        {
            Ok(n) => n,
            Err(e @ kube::Error::Api(_)) => {
                observed.objects.apply_error = Some(brief(&e));
                0
            }
            Err(e) => return Err(e),
        };
        Ok::<_, kube::Error>((observed, n))
    };
    match tokio::time::timeout(ctx.config.timeouts.observe, work).await {
        Ok(Ok((observed, n))) => (Observation::Seen(Box::new(observed.objects)), n),
        Ok(Err(e)) => (Observation::Unreachable(brief(&e)), 0),
        Err(_) => (Observation::Unreachable("did not answer in time".into()), 0),
    }
}

async fn remove_in(
    ctx: &CacheContext,
    cache: &ModelCache,
    clusters: &[Arc<InferenceCluster>],
    name: &str,
) -> Result<usize, String> {
    let (client, _) = member_client(ctx, clusters, name).await?;
    match tokio::time::timeout(ctx.config.timeouts.observe, members::remove(&client, cache, &ctx.config.install_id))
        .await
    {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(brief(&e)),
        Err(_) => Err("did not answer in time".into()),
    }
}

/// Writes status when it differs, through `status_patch::write_status` (fields that went away
/// are deleted; conditional on the resourceVersion read). Returns whether it wrote.
async fn write_status(ctx: &CacheContext, cache: &ModelCache, next: ModelCacheStatus) -> Result<bool, Error> {
    let pp = PatchParams::apply(&ctx.config.field_manager);
    let written = crate::status_patch::write_status(
        &api(ctx, cache),
        &cache.name_any(),
        cache.status.as_ref(),
        cache.resource_version(),
        &next,
        &pp,
    )
    .await?;
    if written.is_none() {
        return Ok(false);
    }
    ctx.metrics.status_write(Kind::ModelCache);
    tracing::info!(
        cache = %format!("{}/{}", cache.namespace().unwrap_or_default(), cache.name_any()),
        ready = next.ready_clusters.as_deref().unwrap_or(""),
        clusters = next.summary.as_deref().unwrap_or(""),
        "status updated"
    );
    Ok(true)
}
