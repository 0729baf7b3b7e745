//! The reconcilers: one per Flotilla kind on `kube::runtime::Controller`, member-cluster
//! clients, rendering of member workloads, status writing and leader election. Each
//! reconciler gathers a snapshot, calls a pure function for the decision, and applies it.

pub mod cache;
pub mod claim;
pub mod class;
pub mod cluster;
pub mod cluster_delete;
pub mod deployment;
pub mod inventory;
pub mod member;
pub mod metrics;
pub mod render;
pub mod render_budget;
pub mod server;
pub mod solve_once;
pub mod status_patch;
pub mod sweep;
pub mod tenancy;

use std::sync::Arc;
use std::time::Duration;

use flotilla_apis::{CapacityClaim, InferenceClass, InferenceCluster, ModelCache, ModelDeployment};
use futures_util::StreamExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client};

/// Makes `ring` the process's rustls crypto provider. kube's TLS asks rustls for the process
/// default, and a workspace build that also links the AWS SDK enables both of rustls' providers,
/// so none is chosen automatically. Idempotent; call before building any client.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The `User-Agent` of every request the controller sends, to the control cluster and to the
/// members, so that an API server's audit log tells Flotilla's requests from those of other
/// clients (kube-rs sends none of its own).
pub const USER_AGENT: &str = concat!("flotilla-controller/", env!("CARGO_PKG_VERSION"));

/// Makes `config`'s requests carry [`USER_AGENT`].
pub fn identify(config: &mut kube::Config) {
    config.headers.retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT)));
}

/// Errors of a reconcile. Transient ones are retried with per-object backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control cluster's API failed.
    #[error("control cluster API: {}", member::brief(.0))]
    Kube(#[from] kube::Error),
    /// The finalizer machinery failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// Member objects could not all be removed; the finalizer stays.
    #[error("cleanup incomplete: {0}")]
    Cleanup(String),
    /// The object changed between the read and a finalizer patch (its JSON-patch `test`
    /// failed, or a conflict): looked at again shortly, from the newer version.
    #[error("object changed meanwhile: {0}")]
    Stale(String),
    /// The fleet solve did not finish (it panicked): retried with back-off, nothing applied.
    #[error("fleet solve failed: {0}")]
    Solve(String),
}

/// A finalizer-wrapped reconcile's error as the reconcile's own: the inner error as it was, a
/// failed finalizer patch as a control-cluster API error.
pub(crate) fn from_finalizer(e: kube::runtime::finalizer::Error<Error>) -> Error {
    use kube::runtime::finalizer::Error as F;
    match e {
        F::ApplyFailed(e) | F::CleanupFailed(e) => e,
        F::AddFinalizer(kube::Error::Api(s)) | F::RemoveFinalizer(kube::Error::Api(s))
            if s.code == 409 || s.code == 422 =>
        {
            Error::Stale(s.message)
        }
        F::AddFinalizer(e) | F::RemoveFinalizer(e) => Error::Kube(e),
        other => Error::Finalizer(other.to_string()),
    }
}

/// Tunables.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// How often each member is observed.
    pub poll: Duration,
    /// How often the heartbeat is refreshed when nothing else changes; zero (the default):
    /// only with a change, so a quiet fleet writes nothing (`--heartbeat-seconds`).
    pub heartbeat_every: Duration,
    /// A replica whose pod the member's scheduler refuses for longer than this is placed
    /// elsewhere (`--unschedulable-seconds`).
    pub unschedulable_after: Duration,
    /// A pool that refused a deployment's pods takes no new replica of it for this long after
    /// (`status.refusedPools`, `--unschedulable-backoff-seconds`); zero: no back-off.
    pub unschedulable_backoff: Duration,
    /// At most this many ModelDeployment reconciles run at once (`--deployment-concurrency`):
    /// a burst of a thousand applies queues instead of holding a thousand reconciles' memory
    /// and member requests in flight on the runtime's workers.
    pub deployment_concurrency: u16,
    /// Member call timeouts.
    pub timeouts: member::Timeouts,
    /// Field manager of status writes (identifies the replica too).
    pub field_manager: String,
    /// Image of the ModelCache staging Job (`flotilla-stage`, see docs/staging.md).
    pub stage_image: String,
    /// Whether staging Jobs may reach the instance metadata service (the node's IAM role)
    /// through the AWS SDK (`--stage-allow-instance-metadata`); off by default.
    pub stage_instance_metadata: bool,
    /// Where CapacityClaims get capacity; without one, claims are left alone.
    pub capacity: Option<Capacity>,
    /// The namespaces tenant objects may use.
    pub tenancy: tenancy::Tenancy,
    /// How often every member is swept for objects no ModelDeployment or ModelCache owns.
    pub sweep_every: Duration,
    /// A sweep pass that would delete more than this percentage of a member's objects of this
    /// installation (and more than [`sweep::ALWAYS`]) deletes nothing and waits for an
    /// operator (`--sweep-max-share`).
    pub sweep_max_share: u32,
    /// Objects younger than this are never swept (`--sweep-grace-seconds`).
    pub sweep_grace: Duration,
    /// This installation's identity, the value of `flotilla.dev/install` on everything it writes
    /// to members (`--install-id`; by default the control cluster's `kube-system` UID).
    pub install_id: String,
    /// Namespace of member kubeconfig Secrets whose `secretRef` names none.
    pub secret_namespace: String,
    /// The provider file ClusterProfiles are resolved against (`--cluster-profile-providers`).
    pub cluster_profile_providers: Option<Arc<member::profiles::ProviderFile>>,
}

/// The capacity provider claims are solved against.
#[derive(Clone)]
pub struct Capacity {
    /// The provider.
    pub provider: Arc<dyn flotilla_providers::CapacityProvider>,
    /// Whether its acquisitions' nodes are created in members (simulated clouds).
    pub materialize: bool,
}

impl std::fmt::Debug for Capacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capacity")
            .field("provider", &self.provider.name())
            .field("materialize", &self.materialize)
            .finish()
    }
}

/// The install id of a configuration built with `Default` (tests); the controller binary always
/// sets its own.
pub const DEFAULT_INSTALL_ID: &str = "local";

/// Checks an install id: a label value (at most 63 letters, digits, `-`, `_`, `.`, beginning
/// and ending with a letter or digit).
pub fn check_install_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= render::MAX_LABEL
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{id:?} is not a label value: use 1 to 63 letters, digits, '-', '_' or '.', beginning and ending with a \
             letter or digit"
        ))
    }
}

/// The staging image used when none is configured.
pub const DEFAULT_STAGE_IMAGE: &str = concat!("ghcr.io/flotilla-dev/flotilla-stage:", env!("CARGO_PKG_VERSION"));

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(10),
            heartbeat_every: Duration::ZERO,
            unschedulable_after: Duration::from_secs(120),
            unschedulable_backoff: Duration::from_secs(600),
            deployment_concurrency: 32,
            timeouts: member::Timeouts::default(),
            field_manager: "flotilla-controller".into(),
            capacity: None,
            stage_image: DEFAULT_STAGE_IMAGE.into(),
            stage_instance_metadata: false,
            tenancy: tenancy::Tenancy::new([member::DEFAULT_SECRET_NAMESPACE.to_string()], []),
            sweep_every: Duration::from_secs(300),
            sweep_max_share: 50,
            sweep_grace: sweep::GRACE,
            install_id: DEFAULT_INSTALL_ID.into(),
            secret_namespace: member::DEFAULT_SECRET_NAMESPACE.into(),
            cluster_profile_providers: None,
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// The control cluster.
    pub client: Client,
    /// InferenceClasses, from a reflector.
    pub classes: Store<InferenceClass>,
    /// Member clients (shared with the ModelDeployment controller).
    pub members: Arc<member::MemberClients>,
    /// ModelDeployments and ModelCaches (the tenants' namespaces, for a deletion's cleanup).
    pub tenants: (Store<ModelDeployment>, Store<ModelCache>),
    /// Metrics.
    pub metrics: metrics::Metrics,
    /// Tunables.
    pub config: ControllerConfig,
    failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

/// A reflector driven by its own task: the store, and streams of "something changed" ticks
/// (coalesced; one per subscriber) for `reconcile_all_on` and the fleet trigger. `on_event`
/// sees every watch event right after the store took it in (the trigger's facts). The task
/// stops when the returned guard is dropped.
fn spawn_reflector<K, F>(
    api: Api<K>,
    subscribers: usize,
    on_event: F,
) -> (Store<K>, Vec<impl futures_util::Stream<Item = ()> + Send + use<K, F>>, member::AbortOnDrop)
where
    F: Fn(&watcher::Event<K>) + Send + Sync + 'static,
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let mut senders = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..subscribers {
        let (tx, rx) = tokio::sync::mpsc::channel::<()>(1);
        senders.push(tx);
        streams.push(futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) }));
    }
    let task = tokio::spawn(async move {
        reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .for_each(|r| {
                if let Ok(event) = r {
                    on_event(&event);
                    if matches!(event, watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)
                    {
                        for tx in &senders {
                            let _ = tx.try_send(());
                        }
                    }
                }
                async {}
            })
            .await;
    });
    (store, streams, member::AbortOnDrop(task))
}

/// Runs every reconciler until `shutdown` resolves. `ready` is called once the caches are
/// synced and the reconcilers run.
pub async fn run_controllers(
    client: Client,
    config: ControllerConfig,
    metrics: metrics::Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    ready: impl FnOnce() + Send,
) {
    let members = Arc::new(
        member::MemberClients::new(config.secret_namespace.clone())
            .with_cluster_profile_providers(config.cluster_profile_providers.clone()),
    );
    let facts = deployment::trigger::Facts::default();
    let (classes, mut class_ticks, _class_task) = {
        let facts = facts.clone();
        spawn_reflector(Api::<InferenceClass>::all(client.clone()), 2, move |e| facts.class_event(e))
    };
    let (clusters, mut cluster_ticks, _cluster_task) = {
        let facts = facts.clone();
        spawn_reflector(Api::<InferenceCluster>::all(client.clone()), 3, move |e| facts.cluster_event(e))
    };
    let (caches, mut cache_ticks, _cache_task) = {
        let facts = facts.clone();
        spawn_reflector(Api::<ModelCache>::all(client.clone()), 1, move |e| facts.cache_event(e))
    };
    let (deployments, mut deployment_ticks, _deployment_task) =
        spawn_reflector(Api::<ModelDeployment>::all(client.clone()), 2, |_| {});
    let (claim_store, _, _claim_task) = spawn_reflector(Api::<CapacityClaim>::all(client.clone()), 0, |_| {});
    // Plans and inventory need the whole fleet: start reconciling once it has been listed.
    let _ = classes.wait_until_ready().await;
    let _ = clusters.wait_until_ready().await;
    let _ = caches.wait_until_ready().await;
    let _ = deployments.wait_until_ready().await;
    let _ = claim_store.wait_until_ready().await;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let relay = async move {
        shutdown.await;
        let _ = tx.send(true);
    };
    let (
        Some(class_tick_a),
        Some(class_tick_b),
        Some(cluster_tick_a),
        Some(cluster_tick_b),
        Some(cluster_tick_c),
        Some(cache_tick),
        Some(deployment_tick_a),
        Some(deployment_tick_b),
    ) = (
        class_ticks.pop(),
        class_ticks.pop(),
        cluster_ticks.pop(),
        cluster_ticks.pop(),
        cluster_ticks.pop(),
        cache_ticks.pop(),
        deployment_ticks.pop(),
        deployment_ticks.pop(),
    )
    else {
        return;
    };
    ready();
    let claims = run_claim_controller(
        client.clone(),
        config.clone(),
        metrics.clone(),
        members.clone(),
        (classes.clone(), clusters.clone()),
        stop(rx.clone()),
    );
    // A deleted InferenceCluster's client and watches go with it.
    let forget = {
        let (members, clusters, stop) = (members.clone(), clusters.clone(), stop(rx.clone()));
        async move {
            let prune = cluster_tick_c.for_each(|()| {
                let names = clusters.state().iter().map(|c| kube::ResourceExt::name_any(c.as_ref())).collect();
                for gone in members.retain(&names) {
                    tracing::info!(cluster = %gone, "InferenceCluster deleted: its member client and watches stopped");
                }
                async {}
            });
            tokio::select! { () = prune => {}, () = stop => {} }
        }
    };
    let sweep = sweep::run(
        sweep::SweepContext {
            client: client.clone(),
            clusters: clusters.clone(),
            deployments: deployments.clone(),
            caches: caches.clone(),
            members: members.clone(),
            timeouts: config.timeouts,
            install: config.install_id.clone(),
            max_share: config.sweep_max_share,
            grace: config.sweep_grace,
            metrics: metrics.clone(),
            recorder: kube::runtime::events::Recorder::new(
                client.clone(),
                kube::runtime::events::Reporter { controller: "flotilla-controller".into(), instance: None },
            ),
        },
        config.sweep_every,
        stop(rx.clone()),
    );
    tokio::join!(
        relay,
        claims,
        forget,
        class::run(client.clone(), stop(rx.clone())),
        sweep,
        run_cluster_controller(
            client.clone(),
            config.clone(),
            metrics.clone(),
            members.clone(),
            (classes.clone(), deployments.clone(), caches.clone()),
            class_tick_a,
            stop(rx.clone())
        ),
        run_deployment_controller(
            deployment::DeploymentContext::new(
                client.clone(),
                deployment::Stores {
                    clusters: clusters.clone(),
                    classes,
                    caches,
                    deployments: deployments.clone(),
                    claims: claim_store,
                },
                members.clone(),
                metrics.clone(),
                config.clone(),
            ),
            facts,
            futures_util::stream::select(
                futures_util::stream::select(class_tick_b, cluster_tick_a),
                futures_util::stream::select(cache_tick, deployment_tick_b)
            ),
            stop(rx.clone())
        ),
        run_cache_controller(
            cache::CacheContext { client, clusters, deployments, members, metrics, config },
            futures_util::stream::select(cluster_tick_b, deployment_tick_a),
            stop(rx)
        ),
    );
}

/// Runs the ModelCache controller until `shutdown` resolves.
async fn run_cache_controller(
    ctx: cache::CacheContext,
    ticks: impl futures_util::Stream<Item = ()> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let failures: Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>> = Default::default();
    let f2 = failures.clone();
    Controller::new(Api::<ModelCache>::all(ctx.client.clone()), watcher::Config::default())
        .reconcile_all_on(ticks)
        .graceful_shutdown_on(shutdown)
        .run(
            move |obj, ctx: Arc<cache::CacheContext>| {
                let f = f2.clone();
                let key = format!(
                    "{}/{}",
                    kube::ResourceExt::namespace(obj.as_ref()).unwrap_or_default(),
                    kube::ResourceExt::name_any(obj.as_ref())
                );
                async move {
                    let r = cache::reconcile(obj, ctx).await;
                    if r.is_ok()
                        && let Ok(mut f) = f.lock()
                    {
                        f.remove(&key);
                    }
                    r
                }
            },
            move |obj, err, ctx: Arc<cache::CacheContext>| {
                let key = format!(
                    "{}/{}",
                    kube::ResourceExt::namespace(obj.as_ref()).unwrap_or_default(),
                    kube::ResourceExt::name_any(obj.as_ref())
                );
                let wait = retry_after(&failures, "ModelCache", &key, err, Duration::MAX);
                ctx.metrics.reconciled(metrics::Kind::ModelCache, metrics::Outcome::Error, Duration::ZERO);
                Action::requeue(wait)
            },
            Arc::new(ctx),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("controller: {e}");
            }
        })
        .await;
}

/// After a failed reconcile: logs it (a stale read at debug, the rest as warnings) and says when
/// to look again (soon after a stale read; otherwise backing off per object, up to `cap`).
fn retry_after(
    failures: &std::sync::Mutex<std::collections::HashMap<String, u32>>,
    kind: &str,
    key: &str,
    err: &Error,
    cap: Duration,
) -> Duration {
    if let Error::Stale(why) = err {
        tracing::debug!(kind, object = %key, "{why}; looking again");
        return Duration::from_millis(500);
    }
    let wait = backoff(failures, key).min(cap);
    tracing::warn!(kind, object = %key, "reconcile failed ({err}); retrying in {wait:?}");
    wait
}

fn backoff(failures: &std::sync::Mutex<std::collections::HashMap<String, u32>>, key: &str) -> Duration {
    let n = failures
        .lock()
        .map(|mut f| {
            let n = f.entry(key.to_string()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        })
        .unwrap_or(1);
    Duration::from_millis(500u64.saturating_mul(1 << n.min(9))).min(Duration::from_secs(300))
}

/// How many wake-ups may wait between the fleet trigger and the controller (the trigger waits
/// when they are full; the controller's scheduler merges repeats of one deployment).
const WAKE_BUFFER: usize = 1024;

/// How long the fleet trigger lets a burst of changes settle before it solves once.
const FLEET_DEBOUNCE: Duration = Duration::from_millis(500);

/// Runs the ModelDeployment controller until `shutdown` resolves. Each deployment is reconciled
/// when it changes, when the fleet trigger wakes it (`deployment::trigger`: its plan entry, its
/// cache, its clusters' reachability changed) and on its own requeue; never all at once because
/// some cluster's status moved.
async fn run_deployment_controller(
    ctx: deployment::DeploymentContext,
    facts: deployment::trigger::Facts,
    ticks: impl futures_util::Stream<Item = ()> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    // A burst of changes to one deployment (an apply and its status writes) reconciles it once.
    let controller = Controller::new(Api::<ModelDeployment>::all(ctx.client.clone()), watcher::Config::default())
        .with_config(
            kube::runtime::controller::Config::default()
                .debounce(Duration::from_millis(250))
                .concurrency(ctx.config.deployment_concurrency),
        );
    let ctx = Arc::new(ctx);
    let (wake_tx, wake_rx) = tokio::sync::mpsc::channel(WAKE_BUFFER);
    let wakes = futures_util::stream::unfold(wake_rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) });
    let trigger = deployment::trigger::run(ctx.clone(), facts, ticks, wake_tx, FLEET_DEBOUNCE);
    let failures: Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>> = Default::default();
    let f2 = failures.clone();
    let controller = controller
        .reconcile_on(wakes)
        .graceful_shutdown_on(shutdown)
        .run(
            move |obj, ctx: Arc<deployment::DeploymentContext>| {
                let f = f2.clone();
                let key = kube::ResourceExt::name_any(obj.as_ref());
                async move {
                    let r = deployment::reconcile(obj, ctx).await;
                    if r.is_ok()
                        && let Ok(mut f) = f.lock()
                    {
                        f.remove(&key);
                    }
                    r
                }
            },
            move |obj, err, ctx: Arc<deployment::DeploymentContext>| {
                let key = kube::ResourceExt::name_any(obj.as_ref());
                let wait = retry_after(&failures, "ModelDeployment", &key, err, Duration::MAX);
                ctx.metrics.reconciled(metrics::Kind::ModelDeployment, metrics::Outcome::Error, Duration::ZERO);
                Action::requeue(wait)
            },
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("controller: {e}");
            }
        });
    // The trigger lives as long as the controller: it ends with it (shutdown), never before.
    tokio::select! {
        () = controller => {}
        () = async { trigger.await; std::future::pending::<()>().await } => {}
    }
}

/// Runs the CapacityClaim controller until `shutdown` resolves (nothing without a provider).
async fn run_claim_controller(
    client: Client,
    config: ControllerConfig,
    metrics: metrics::Metrics,
    members: Arc<member::MemberClients>,
    (classes, clusters): (Store<InferenceClass>, Store<InferenceCluster>),
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let Some(capacity) = config.capacity.clone() else {
        tracing::info!("no capacity provider configured: CapacityClaims are not reconciled");
        return;
    };
    // Claim nodes are tainted `flotilla.dev/claim=<namespace>.<name>:NoSchedule`: the
    // inventory reports them as reserved for the claim, the solver places only the owning
    // deployment there, and its pods tolerate the taint.
    let settings = flotilla_providers::EngineSettings::default();
    let ctx = Arc::new(claim::ClaimContext {
        client: client.clone(),
        provider: capacity.provider,
        engine: flotilla_providers::ClaimEngine::new(settings),
        classes,
        clusters,
        members,
        materialize: capacity.materialize,
        metrics,
        config,
    });
    let failures: Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>> = Default::default();
    Controller::new(Api::<flotilla_apis::CapacityClaim>::all(client), watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(
            claim::reconcile,
            move |obj, err, ctx: Arc<claim::ClaimContext>| {
                let key = kube::ResourceExt::name_any(obj.as_ref());
                let wait = retry_after(&failures, "CapacityClaim", &key, err, Duration::from_secs(30));
                ctx.metrics.reconciled(metrics::Kind::CapacityClaim, metrics::Outcome::Error, Duration::ZERO);
                Action::requeue(wait)
            },
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("claim controller: {e}");
            }
        })
        .await;
}

fn error_policy(obj: Arc<InferenceCluster>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = kube::ResourceExt::name_any(obj.as_ref());
    let wait = retry_after(&ctx.failures, "InferenceCluster", &key, err, Duration::MAX);
    ctx.metrics.reconciled(metrics::Kind::InferenceCluster, metrics::Outcome::Error, Duration::ZERO);
    Action::requeue(wait)
}

/// Runs the InferenceCluster controller until `shutdown` resolves.
async fn run_cluster_controller(
    client: Client,
    config: ControllerConfig,
    metrics: metrics::Metrics,
    members: Arc<member::MemberClients>,
    (classes, deployments, caches): (Store<InferenceClass>, Store<ModelDeployment>, Store<ModelCache>),
    class_ticks: impl futures_util::Stream<Item = ()> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ctx = Arc::new(Context {
        client: client.clone(),
        classes,
        members,
        tenants: (deployments, caches),
        metrics,
        config,
        failures: Default::default(),
    });
    Controller::new(Api::<InferenceCluster>::all(client), watcher::Config::default())
        .reconcile_all_on(class_ticks)
        .graceful_shutdown_on(shutdown)
        .run(
            |obj, ctx: Arc<Context>| {
                let key = kube::ResourceExt::name_any(obj.as_ref());
                async move {
                    let r = cluster::reconcile(obj, ctx.clone()).await;
                    if r.is_ok()
                        && let Ok(mut f) = ctx.failures.lock()
                    {
                        f.remove(&key);
                    }
                    r
                }
            },
            error_policy,
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!("controller: {e}");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::finalizer::Error as F;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            serde_json::from_value(serde_json::json!({"status": "Failure", "message": "the test failed",
                "reason": "Invalid", "code": code}))
            .unwrap(),
        )
    }

    #[test]
    fn a_finalizer_patch_on_a_stale_read_is_looked_at_again_not_reported() {
        assert!(matches!(from_finalizer(F::AddFinalizer(api(422))), Error::Stale(_)));
        assert!(matches!(from_finalizer(F::RemoveFinalizer(api(409))), Error::Stale(_)));
        assert!(matches!(from_finalizer(F::AddFinalizer(api(403))), Error::Kube(_)), "a refusal stays an error");
        let failures = Default::default();
        let stale = Error::Stale("x".into());
        assert_eq!(
            retry_after(&failures, "ModelDeployment", "ml/a", &stale, Duration::MAX),
            Duration::from_millis(500)
        );
        assert!(failures.lock().unwrap().is_empty(), "a stale read is not a failure");
        let hard = Error::Finalizer("x".into());
        assert_eq!(retry_after(&failures, "ModelDeployment", "ml/a", &hard, Duration::MAX), Duration::from_secs(1));
        assert_eq!(retry_after(&failures, "ModelDeployment", "ml/a", &hard, Duration::MAX), Duration::from_secs(2));
    }

    #[test]
    fn install_ids_are_label_values() {
        for ok in ["local", "prod-eu", "0f6b6a4e-8a1c-4a7e-9b7e-2f3c1d2e4a5b", "a.b_c"] {
            assert_eq!(check_install_id(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-x", "x-", "has space", "a/b", &"x".repeat(64)] {
            let e = check_install_id(bad).unwrap_err();
            assert!(e.contains("not a label value"), "{bad}: {e}");
        }
    }

    #[test]
    fn every_client_config_says_it_is_the_controller_once() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static("kubectl/v1.36")));
        identify(&mut config);
        identify(&mut config);
        let agents: Vec<_> = config.headers.iter().filter(|(n, _)| n == http::header::USER_AGENT).collect();
        assert_eq!(agents.len(), 1);
        assert!(agents[0].1.to_str().unwrap().starts_with("flotilla-controller/"));
    }
}
