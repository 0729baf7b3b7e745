//! The reconcilers: one per Flotilla kind on `kube::runtime::Controller`, member-cluster
//! clients, rendering of member workloads, status writing and leader election. Each
//! reconciler gathers a snapshot, calls a pure function for the decision, and applies it.

pub mod cluster;
pub mod inventory;
pub mod member;
pub mod metrics;
pub mod server;

use std::sync::Arc;
use std::time::Duration;

use flotilla_apis::{InferenceClass, InferenceCluster};
use futures_util::StreamExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client};

/// Errors of a reconcile. Transient ones are retried with per-object backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control cluster's API failed.
    #[error("control cluster API: {}", member::brief(.0))]
    Kube(#[from] kube::Error),
}

/// Tunables.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// How often each member is observed.
    pub poll: Duration,
    /// How often the heartbeat is refreshed when nothing else changes.
    pub heartbeat_every: Duration,
    /// Member call timeouts.
    pub timeouts: member::Timeouts,
    /// Field manager of status writes (identifies the replica too).
    pub field_manager: String,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(10),
            heartbeat_every: Duration::from_secs(300),
            timeouts: member::Timeouts::default(),
            field_manager: "flotilla-controller".into(),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// The control cluster.
    pub client: Client,
    /// InferenceClasses, from a reflector.
    pub classes: Store<InferenceClass>,
    /// Member clients.
    pub members: member::MemberClients,
    /// Metrics.
    pub metrics: metrics::Metrics,
    /// Tunables.
    pub config: ControllerConfig,
    failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

fn error_policy(obj: Arc<InferenceCluster>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = kube::ResourceExt::name_any(obj.as_ref());
    let n = ctx
        .failures
        .lock()
        .map(|mut f| {
            let n = f.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        })
        .unwrap_or(1);
    let backoff = Duration::from_millis(500u64.saturating_mul(1 << n.min(9))).min(Duration::from_secs(300));
    ctx.metrics.reconciled(metrics::Kind::InferenceCluster, metrics::Outcome::Error, Duration::ZERO);
    tracing::warn!(cluster = %key, "reconcile failed ({err}); retrying in {backoff:?}");
    Action::requeue(backoff)
}

/// Runs the InferenceCluster controller until `shutdown` resolves. `ready` is called once the
/// caches are synced.
pub async fn run_cluster_controller(
    client: Client,
    config: ControllerConfig,
    metrics: metrics::Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    ready: impl FnOnce() + Send,
) {
    let (classes, writer) = reflector::store::<InferenceClass>();
    let class_stream =
        reflector::reflector(writer, watcher(Api::<InferenceClass>::all(client.clone()), watcher::Config::default()))
            .default_backoff()
            .touched_objects()
            .filter_map(|r| async move { r.ok() });
    let ctx = Arc::new(Context {
        client: client.clone(),
        classes: classes.clone(),
        members: member::MemberClients::default(),
        metrics,
        config,
        failures: Default::default(),
    });
    let clusters: Api<InferenceCluster> = Api::all(client);
    let controller = Controller::new(clusters, watcher::Config::default());
    let cluster_store = controller.store();
    let controller = controller.reconcile_all_on(class_stream.map(|_| ())).graceful_shutdown_on(shutdown);
    let mut ready = Some(ready);
    let waiter = async {
        let _ = classes.wait_until_ready().await;
        let _ = cluster_store.wait_until_ready().await;
        if let Some(r) = ready.take() {
            r();
        }
    };
    let run = controller
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
        .for_each(|_| async {});
    tokio::join!(waiter, run);
}
