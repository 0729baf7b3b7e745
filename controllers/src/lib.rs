//! The reconcilers: one per Flotilla kind on `kube::runtime::Controller`, member-cluster
//! clients, rendering of member workloads, status writing and leader election. Each
//! reconciler gathers a snapshot, calls a pure function for the decision, and applies it.
//!
//! This file is the wiring: each control-cluster kind is watched once (`watched`), its
//! controller runs on that watch through one runner (`runner`), and the controllers that look at
//! every object when another kind moves subscribe to that kind's wake-ups by name.
//! Configuration is in `config`, errors in `error`.

pub mod cache;
pub mod claim;
pub mod class;
pub mod cluster;
pub mod cluster_delete;
pub mod config;
pub mod deployment;
pub mod error;
pub mod inventory;
pub mod member;
pub mod metrics;
pub mod quota;
pub mod render;
pub mod render_budget;
pub mod runner;
pub mod server;
pub mod solve_once;
pub mod status_patch;
pub mod sweep;
pub mod tenancy;
pub mod watched;

use std::sync::Arc;
use std::time::Duration;

pub use config::{Capacity, ControllerConfig, DEFAULT_INSTALL_ID, DEFAULT_STAGE_IMAGE, check_install_id};
pub use error::Error;
pub(crate) use error::from_finalizer;
use flotilla_apis::{CapacityClaim, FleetQuota, InferenceClass, InferenceCluster, ModelCache, ModelDeployment};
use futures_util::StreamExt;
use futures_util::stream::select_all;
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use watched::{OwnController, Watched};

/// Makes `ring` the process's rustls crypto provider (idempotent; call before building any
/// client): the workspace's one [`flotilla_apis::crypto::install_crypto`].
pub use flotilla_apis::crypto::install_crypto;

/// The `User-Agent` of every request the controller sends, to the control cluster and to the
/// members, so that an API server's audit log tells Flotilla's requests from those of other
/// clients (kube-rs sends none of its own).
pub const USER_AGENT: &str = concat!("flotilla-controller/", env!("CARGO_PKG_VERSION"));

/// Makes `config`'s requests carry [`USER_AGENT`].
pub fn identify(config: &mut kube::Config) {
    config.headers.retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_static(USER_AGENT)));
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
    // One watch per kind; the fleet trigger's facts come from the same events.
    let facts = deployment::trigger::Facts::default();
    let cache_facts = cache::wake::CacheFacts::default();
    let mut classes = {
        let facts = facts.clone();
        Watched::start(Api::<InferenceClass>::all(client.clone()), OwnController::Yes, move |e| facts.class_event(e))
    };
    let mut clusters = {
        let (facts, cache_facts) = (facts.clone(), cache_facts.clone());
        Watched::start(Api::<InferenceCluster>::all(client.clone()), OwnController::Yes, move |e| {
            facts.cluster_event(e);
            cache_facts.cluster_event(e);
        })
    };
    let mut caches = {
        let facts = facts.clone();
        Watched::start(Api::<ModelCache>::all(client.clone()), OwnController::Yes, move |e| facts.cache_event(e))
    };
    let mut deployments = {
        let (facts, cache_facts) = (facts.clone(), cache_facts.clone());
        Watched::start(Api::<ModelDeployment>::all(client.clone()), OwnController::Yes, move |e| {
            facts.deployment_event(e);
            cache_facts.deployment_event(e);
        })
    };
    // FleetQuotas, where the control cluster serves the kind (Helm does not upgrade CRDs: an
    // installation upgraded without applying the new CRD has none, and enforces none).
    let quotas = if quotas_served(&client).await {
        let facts = facts.clone();
        Some(Watched::start(Api::<FleetQuota>::all(client.clone()), OwnController::No, move |e| facts.quota_event(e)))
    } else {
        None
    };
    let claims_run = if config.capacity.is_some() { OwnController::Yes } else { OwnController::No };
    let mut claims = Watched::start(Api::<CapacityClaim>::all(client.clone()), claims_run, |_| {});
    // Plans and inventory need the whole fleet: start reconciling once it has been listed.
    let _ = classes.store().wait_until_ready().await;
    let _ = clusters.store().wait_until_ready().await;
    let _ = caches.store().wait_until_ready().await;
    let _ = deployments.store().wait_until_ready().await;
    let _ = claims.store().wait_until_ready().await;
    if let Some(q) = &quotas {
        let _ = q.store().wait_until_ready().await;
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let relay = async move {
        shutdown.await;
        let _ = tx.send(true);
    };
    ready();
    let claim_store = claims.store();
    let claims = run_claim_controller(
        (claims_run == OwnController::Yes).then(|| claims.controller()),
        client.clone(),
        config.clone(),
        metrics.clone(),
        members.clone(),
        (classes.store(), clusters.store()),
        stop(rx.clone()),
    );
    // A deleted InferenceCluster's client and watches go with it.
    let forget = {
        let (members, store, stop) = (members.clone(), clusters.store(), stop(rx.clone()));
        let prune = clusters.changes("member client pruning").for_each(move |()| {
            let names = store.state().iter().map(|c| kube::ResourceExt::name_any(c.as_ref())).collect();
            for gone in members.retain(&names) {
                tracing::info!(cluster = %gone, "InferenceCluster deleted: its member client and watches stopped");
            }
            async {}
        });
        async move {
            tokio::select! { () = prune => {}, () = stop => {} }
        }
    };
    let sweep = sweep::run(
        sweep::SweepContext {
            client: client.clone(),
            clusters: clusters.store(),
            deployments: deployments.store(),
            caches: caches.store(),
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
    // A class change can change every cluster's inventory.
    let cluster_controller = clusters
        .controller()
        .reconcile_all_on(classes.changes("InferenceCluster controller"))
        .graceful_shutdown_on(stop(rx.clone()));
    let cluster_ctx = Context {
        client: client.clone(),
        classes: classes.store(),
        members: members.clone(),
        tenants: (deployments.store(), caches.store()),
        metrics: metrics.clone(),
        config: config.clone(),
    };
    // The fleet trigger looks at what changed in any kind a plan reads.
    let mut fleet_inputs = vec![
        classes.changes("fleet trigger").boxed(),
        clusters.changes("fleet trigger").boxed(),
        caches.changes("fleet trigger").boxed(),
        deployments.changes("fleet trigger").boxed(),
    ];
    fleet_inputs.extend(quotas.as_ref().map(|q| q.changes("fleet trigger").boxed()));
    let fleet_changes = select_all(fleet_inputs);
    // A cache's targets follow the clusters and the deployments that use it: only the caches a
    // change concerns are woken (`cache::wake`).
    let cache_ticks =
        futures_util::stream::select(clusters.changes("ModelCache trigger"), deployments.changes("ModelCache trigger"));
    let deployment_ctx = deployment::DeploymentContext::new(
        client.clone(),
        deployment::Stores {
            clusters: clusters.store(),
            classes: classes.store(),
            caches: caches.store(),
            deployments: deployments.store(),
            claims: claim_store,
            quotas: quotas.as_ref().map_or_else(
                || kube::runtime::reflector::store::Writer::<FleetQuota>::default().as_reader(),
                Watched::store,
            ),
        },
        members.clone(),
        metrics.clone(),
        config.clone(),
        facts.digest.clone(),
    );
    // A re-plan divergence resolved by the whole plan wakes the deployments it changes.
    let fleet_changes = futures_util::stream::select(fleet_changes, deployment_ctx.crosscheck.resolutions());
    let cache_ctx = cache::CacheContext {
        client: client.clone(),
        caches: caches.store(),
        clusters: clusters.store(),
        deployments: deployments.store(),
        members,
        metrics: metrics.clone(),
        config,
    };
    tokio::join!(
        relay,
        claims,
        forget,
        class::run(classes.controller().graceful_shutdown_on(stop(rx.clone())), client.clone()),
        sweep,
        runner::run(
            cluster_controller,
            runner::Kind {
                name: "InferenceCluster",
                metric: Some(metrics::Kind::InferenceCluster),
                cap: Duration::MAX
            },
            Some(metrics.clone()),
            cluster::reconcile,
            Arc::new(cluster_ctx),
        ),
        run_deployment_controller(deployments.controller(), deployment_ctx, facts, fleet_changes, stop(rx.clone())),
        run_cache_controller(caches.controller(), cache_ctx, cache_facts, cache_ticks, stop(rx)),
    );
}

/// Whether the control cluster serves FleetQuotas. Unknown (discovery failed): assumed served,
/// as the chart installs every CRD.
async fn quotas_served(client: &Client) -> bool {
    match client.list_api_group_resources(flotilla_apis::constants::API_VERSION).await {
        Ok(list) => {
            let served = list.resources.iter().any(|r| r.name == "fleetquotas");
            if !served {
                tracing::warn!(
                    "the control cluster does not serve FleetQuotas (its CRD was not applied: Helm does not upgrade \
                     CRDs; apply charts/flotilla/crds/fleetquotas.flotilla.dev.yaml and restart): no quota is enforced"
                );
            }
            served
        }
        Err(e) => {
            tracing::warn!(
                "API discovery of {} failed ({e}); FleetQuotas assumed served",
                flotilla_apis::constants::API_VERSION
            );
            true
        }
    }
}

/// Runs the ModelCache controller until `shutdown` resolves. Each cache is reconciled when it
/// changes, when a cluster or deployment change concerns it (`cache::wake`) and on its requeue.
async fn run_cache_controller(
    controller: kube::runtime::Controller<ModelCache>,
    ctx: cache::CacheContext,
    facts: cache::wake::CacheFacts,
    ticks: impl futures_util::Stream<Item = ()> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (wake_tx, wakes) = wake_channel();
    let trigger = cache::wake::run(facts, ctx.caches.clone(), ticks, wake_tx);
    let metrics = ctx.metrics.clone();
    let controller = runner::run(
        controller.reconcile_on(wakes).graceful_shutdown_on(shutdown),
        runner::Kind { name: "ModelCache", metric: Some(metrics::Kind::ModelCache), cap: Duration::MAX },
        Some(metrics),
        cache::reconcile,
        Arc::new(ctx),
    );
    with_trigger(controller, trigger).await;
}

/// How many wake-ups may wait between a trigger and its controller (the trigger waits when
/// they are full; the controller's scheduler merges repeats of one object).
const WAKE_BUFFER: usize = 1024;

/// A bounded channel from a trigger to its controller: the trigger's sender, and the stream
/// `Controller::reconcile_on` takes.
fn wake_channel<K>() -> (
    tokio::sync::mpsc::Sender<kube::runtime::reflector::ObjectRef<K>>,
    impl futures_util::Stream<Item = kube::runtime::reflector::ObjectRef<K>> + Send + 'static,
)
where
    K: kube::Resource + Send + 'static,
    K::DynamicType: Send,
{
    let (tx, rx) = tokio::sync::mpsc::channel(WAKE_BUFFER);
    (tx, futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) }))
}

/// Runs `controller` with its trigger: the trigger lives as long as the controller and ends
/// with it (shutdown), never before.
async fn with_trigger(
    controller: impl std::future::Future<Output = ()>,
    trigger: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        () = controller => {}
        () = async { trigger.await; std::future::pending::<()>().await } => {}
    }
}

/// How long the fleet trigger lets a burst of changes settle before it solves once.
const FLEET_DEBOUNCE: Duration = Duration::from_millis(500);

/// Runs the ModelDeployment controller until `shutdown` resolves. Each deployment is reconciled
/// when it changes, when the fleet trigger wakes it (`deployment::trigger`: its plan entry, its
/// cache, its clusters' reachability changed) and on its own requeue; never all at once because
/// some cluster's status moved.
async fn run_deployment_controller(
    controller: kube::runtime::Controller<ModelDeployment>,
    ctx: deployment::DeploymentContext,
    facts: deployment::trigger::Facts,
    ticks: impl futures_util::Stream<Item = ()> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    // A burst of changes to one deployment (an apply and its status writes) reconciles it once.
    let controller = controller.with_config(
        kube::runtime::controller::Config::default()
            .debounce(Duration::from_millis(250))
            .concurrency(ctx.config.deployment_concurrency),
    );
    let ctx = Arc::new(ctx);
    let (wake_tx, wakes) = wake_channel();
    let trigger = deployment::trigger::run(ctx.clone(), facts, ticks, wake_tx, FLEET_DEBOUNCE);
    let metrics = ctx.metrics.clone();
    let controller = runner::run(
        controller.reconcile_on(wakes).graceful_shutdown_on(shutdown),
        runner::Kind { name: "ModelDeployment", metric: Some(metrics::Kind::ModelDeployment), cap: Duration::MAX },
        Some(metrics),
        deployment::reconcile,
        ctx,
    );
    with_trigger(controller, trigger).await;
}

/// Runs the CapacityClaim controller until `shutdown` resolves (nothing without a provider).
async fn run_claim_controller(
    controller: Option<kube::runtime::Controller<CapacityClaim>>,
    client: Client,
    config: ControllerConfig,
    metrics: metrics::Metrics,
    members: Arc<member::MemberClients>,
    (classes, clusters): (Store<InferenceClass>, Store<InferenceCluster>),
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (Some(controller), Some(capacity)) = (controller, config.capacity.clone()) else {
        tracing::info!("no capacity provider configured: CapacityClaims are not reconciled");
        return;
    };
    // Claim nodes are tainted `flotilla.dev/claim=<namespace>.<name>:NoSchedule`: the
    // inventory reports them as reserved for the claim, the solver places only the owning
    // deployment there, and its pods tolerate the taint.
    let settings = flotilla_providers::EngineSettings::default();
    let ctx = Arc::new(claim::ClaimContext {
        client,
        provider: capacity.provider,
        engine: flotilla_providers::ClaimEngine::new(settings),
        classes,
        clusters,
        members,
        materialize: capacity.materialize,
        metrics: metrics.clone(),
        config,
    });
    runner::run(
        controller.graceful_shutdown_on(shutdown),
        runner::Kind {
            name: "CapacityClaim",
            metric: Some(metrics::Kind::CapacityClaim),
            cap: Duration::from_secs(30),
        },
        Some(metrics),
        claim::reconcile,
        ctx,
    )
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
