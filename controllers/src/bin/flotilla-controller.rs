//! `flotilla-controller`: the Flotilla control plane process. Connects to the control cluster,
//! takes part in leader election on a Lease, runs the reconcilers only while it holds the
//! lease (so two replicas never both write), serves probes and metrics, and shuts down
//! gracefully on SIGTERM or Ctrl-C, releasing the lease.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_controllers::claim::providerfile;
use flotilla_controllers::metrics::Metrics;
use flotilla_controllers::server::{Probes, listen, serve};
use flotilla_controllers::{ControllerConfig, run_controllers};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::watch;

/// The solve allocates many small vectors and a large plan: mimalloc, as in `fleetctl` and the
/// gateway (`docs/benchmarks.md`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Flotilla controller.
#[derive(Debug, Parser)]
#[command(name = "flotilla-controller", version, about)]
struct Args {
    /// Kubeconfig of the control cluster (default: in-cluster, then $KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Where probes and metrics listen.
    #[arg(long, env = "FLOTILLA_PROBE_ADDR", default_value = "0.0.0.0:8081")]
    probe_addr: SocketAddr,
    /// Namespace of the leader Lease.
    #[arg(long, env = "FLOTILLA_LEASE_NAMESPACE", default_value = "flotilla-system")]
    lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(long, default_value = "flotilla-controller")]
    lease_name: String,
    /// This replica's identity (default: $POD_NAME or the host name plus the process id).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Lease duration in seconds; a dead leader is replaced after at most this long.
    #[arg(long, default_value_t = 15)]
    lease_duration: u64,
    /// How often each member cluster is observed, in seconds.
    #[arg(long, default_value_t = 10)]
    poll_seconds: u64,
    /// Member call timeout in seconds (a member that does not answer within it is Unreachable).
    #[arg(long, default_value_t = 8)]
    member_timeout_seconds: u64,
    /// Image of the ModelCache staging Job (runs `flotilla-stage`; see docs/staging.md).
    #[arg(long, env = "FLOTILLA_STAGE_IMAGE", default_value = flotilla_controllers::DEFAULT_STAGE_IMAGE)]
    stage_image: String,
    /// Let ModelCache staging Jobs reach the instance metadata service (the node's IAM role)
    /// through the AWS SDK. Off: every staging container runs with AWS_EC2_METADATA_DISABLED=true,
    /// so a tenant's s3:// source is read with its own credentials (credentialsRef, the service
    /// account's IRSA / Pod Identity) or unsigned, never with the node's role.
    #[arg(long, env = "FLOTILLA_STAGE_ALLOW_INSTANCE_METADATA")]
    stage_allow_instance_metadata: bool,
    /// Solve CapacityClaims against a simulated cloud described in this YAML file (regions, the
    /// InferenceCluster each joins, offerings by InferenceClass); its nodes are created as kwok
    /// nodes in the members. Without a provider, CapacityClaims are left alone.
    #[arg(long, env = "FLOTILLA_SIM_CLOUD", conflicts_with = "capacity_provider")]
    sim_cloud: Option<PathBuf>,
    /// Solve CapacityClaims against real providers chosen per region in this YAML file: `aws`
    /// (EKS managed node groups; credentials from the standard AWS chain) and `static` (the
    /// declared pools of static InferenceClusters). See docs/providers.md. Validated at
    /// start-up: a bad file stops the controller before it reconciles anything. Not combined
    /// with --sim-cloud (its kwok nodes would be reconciled against real regions' nodes).
    #[arg(long, env = "FLOTILLA_CAPACITY_PROVIDER")]
    capacity_provider: Option<PathBuf>,
    /// Namespaces whose ModelDeployments and ModelCaches are reconciled (comma-separated); others
    /// are refused with InvalidSpec. Empty: every namespace except the protected ones
    /// (kube-system, kube-public, kube-node-lease, --lease-namespace and
    /// --member-secret-namespace, Flotilla's own), which are refused whatever this says.
    #[arg(long, env = "FLOTILLA_TENANT_NAMESPACES", value_delimiter = ',')]
    tenant_namespaces: Vec<String>,
    /// Refresh each InferenceCluster's `status.lastHeartbeat` at least this often, in seconds,
    /// even when nothing changed (one status write per member per interval). 0 (the default):
    /// only when its status changes, so a quiet fleet writes nothing; a member that stops
    /// answering is still marked Reachable=False within --poll-seconds plus the member timeout.
    #[arg(long, default_value_t = 0)]
    heartbeat_seconds: u64,
    /// A replica whose pod a member's scheduler refuses (PodScheduled=False, Unschedulable) for
    /// longer than this many seconds is placed elsewhere, and its pool takes no more replicas of
    /// that deployment while any are refused (devices split across nodes, a taint or quota the
    /// solver does not see).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    unschedulable_seconds: u64,
    /// A pool whose member's scheduler refused a deployment's pods takes no new replica of that
    /// deployment for this many seconds after (`status.refusedPools`), so a replica moved away
    /// does not come straight back; when the scheduler said devices were short, no new replica
    /// of any deployment with pods as large either. 0: no back-off.
    #[arg(long, default_value_t = 600)]
    unschedulable_backoff_seconds: u64,
    /// At most this many ModelDeployment reconciles run at once; the others wait their turn in
    /// the queue (each deployment at most once in it).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    deployment_concurrency: u16,
    /// How often every member is swept for objects with Flotilla's labels that no ModelDeployment
    /// or ModelCache owns any more, in seconds.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    sweep_seconds: u64,
    /// A sweep pass that would delete more than this percentage of a member's objects of this
    /// installation (and more than 10) deletes nothing, raises a `SweepHeld` Warning event on
    /// the InferenceCluster and waits for `flotilla.dev/approve-sweep=<count>` there.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100))]
    sweep_max_share: u32,
    /// Objects younger than this many seconds are never swept (their owner may not have reached
    /// the controller's caches yet).
    #[arg(long, default_value_t = 60)]
    sweep_grace_seconds: u64,
    /// One incremental re-plan in this many is solved again whole, off the reconciles' path, and
    /// compared: a divergence is counted (`flotilla_controller_replan_checks_total`), logged with
    /// a reproducer and resolved by the whole plan. 0: never.
    #[arg(long, default_value_t = 16)]
    replan_check_every: u64,
    /// The directory a re-plan divergence's reproducer is written to (default: the temporary
    /// directory).
    #[arg(long)]
    replan_check_dir: Option<std::path::PathBuf>,
    /// This installation's identity: the value of the label `flotilla.dev/install` on every
    /// object it writes to members, and part of every selector, prune, sweep and cleanup, so two
    /// control planes sharing a member never touch each other's objects. At most 63 letters,
    /// digits, `-`, `_`, `.`. Default: the UID of the control cluster's `kube-system`
    /// Namespace. Keep it when the control plane moves (blue/green, restore from backup): set
    /// it explicitly there (docs/operations.md, "Installations sharing a member").
    #[arg(long, env = "FLOTILLA_INSTALL_ID")]
    install_id: Option<String>,
    /// Namespace of member kubeconfig Secrets when an InferenceCluster's secretRef names none
    /// (the Helm chart passes its memberSecrets namespace). Protected like --lease-namespace.
    #[arg(long, env = "FLOTILLA_MEMBER_SECRET_NAMESPACE", default_value = flotilla_controllers::member::DEFAULT_SECRET_NAMESPACE)]
    member_secret_namespace: String,
    /// The ClusterProfile provider file (KEP-5339's format, JSON or YAML: `{"providers": [{"name",
    /// "execConfig": {apiVersion, command, args, env, provideClusterInfo}}]}`): how to get
    /// credentials for the access providers ClusterProfiles name. InferenceClusters with
    /// spec.clusterProfileRef need it (docs/operations.md, "Members from ClusterProfiles"). Read
    /// once at start-up; a bad file stops the controller before it reconciles anything.
    #[arg(long, env = "FLOTILLA_CLUSTER_PROFILE_PROVIDERS")]
    cluster_profile_providers: Option<PathBuf>,
}

/// InferenceClasses by name, for a provider file.
async fn classes(client: &Client, flag: &str) -> anyhow::Result<BTreeMap<String, InferenceClassSpec>> {
    Ok(kube::Api::<flotilla_apis::InferenceClass>::all(client.clone())
        .list(&Default::default())
        .await
        .with_context(|| format!("listing InferenceClasses for {flag}"))?
        .items
        .into_iter()
        .map(|c| (kube::ResourceExt::name_any(&c), c.spec))
        .collect())
}

/// The capacity provider from the flags, if any.
async fn capacity(args: &Args, client: &Client) -> anyhow::Result<Option<flotilla_controllers::Capacity>> {
    if let Some(path) = &args.capacity_provider {
        return capacity_provider(path, client).await.map(Some);
    }
    let Some(path) = &args.sim_cloud else { return Ok(None) };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading --sim-cloud {}", path.display()))?;
    let classes = classes(client, "--sim-cloud").await?;
    let cloud = flotilla_controllers::claim::simfile::load(&text, &classes)
        .map_err(|e| anyhow::anyhow!("--sim-cloud {}: {e}", path.display()))?;
    let clock = std::sync::Arc::new(flotilla_providers::SystemClock);
    let provider = std::sync::Arc::new(flotilla_providers::SimProvider::new(cloud, clock));
    Ok(Some(flotilla_controllers::Capacity { provider, materialize: true }))
}

/// `--capacity-provider FILE`: validated against the InferenceClusters and InferenceClasses
/// present now, then connected (no AWS call yet). Real nodes join by themselves: nothing is
/// materialised.
async fn capacity_provider(path: &PathBuf, client: &Client) -> anyhow::Result<flotilla_controllers::Capacity> {
    let flag = format!("--capacity-provider {}", path.display());
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {flag}"))?;
    let classes = classes(client, "--capacity-provider").await?;
    let clusters: BTreeMap<String, _> = kube::Api::<flotilla_apis::InferenceCluster>::all(client.clone())
        .list(&Default::default())
        .await
        .context("listing InferenceClusters for --capacity-provider")?
        .items
        .into_iter()
        .map(|c| (kube::ResourceExt::name_any(&c), c.spec))
        .collect();
    let plan = providerfile::load(&text, &clusters, &classes).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
    for warning in &plan.warnings {
        tracing::warn!(file = %path.display(), "{warning}");
    }
    let set = providerfile::build(plan, &classes, &providerfile::AwsSettings::default())
        .await
        .map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
    tracing::info!(providers = ?set, "capacity providers configured");
    Ok(flotilla_controllers::Capacity { provider: std::sync::Arc::new(set), materialize: false })
}

async fn control_client(path: Option<&PathBuf>) -> anyhow::Result<Client> {
    let mut config = match path {
        Some(p) => {
            let kc = Kubeconfig::read_from(p).with_context(|| format!("reading kubeconfig {}", p.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => Config::infer().await?,
    };
    flotilla_controllers::identify(&mut config);
    flotilla_controllers::install_crypto();
    Ok(Client::try_from(config)?)
}

fn identity(args: &Args) -> String {
    args.identity.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "flotilla".into());
        format!("{host}-{}", std::process::id())
    })
}

/// `--install-id`, checked; else the UID of the control cluster's `kube-system` Namespace.
async fn install_id(args: &Args, client: &Client) -> anyhow::Result<String> {
    if let Some(id) = &args.install_id {
        flotilla_controllers::check_install_id(id).map_err(|e| anyhow::anyhow!("--install-id: {e}"))?;
        return Ok(id.clone());
    }
    let ns = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()).get("kube-system").await.context(
        "reading the control cluster's kube-system Namespace for the default --install-id: grant get on \
             namespaces/kube-system (the Helm chart does) or set --install-id",
    )?;
    ns.metadata.uid.ok_or_else(|| anyhow::anyhow!("the kube-system Namespace has no UID: set --install-id"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = flotilla_controllers::member::log_filter(std::env::var("RUST_LOG").ok().as_deref());
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(filter)).init();
    let args = Args::parse();
    let client = control_client(args.kubeconfig.as_ref()).await?;
    // Provider files are checked before the lease is sought: a bad one stops the process here.
    let capacity = capacity(&args, &client).await?;
    let profile_providers = match &args.cluster_profile_providers {
        Some(path) => Some(std::sync::Arc::new(
            flotilla_controllers::member::profiles::ProviderFile::load(path)
                .map_err(|e| anyhow::anyhow!("--cluster-profile-providers: {e}"))?,
        )),
        None => None,
    };
    let install_id = install_id(&args, &client).await?;
    tracing::info!(install_id = %install_id, "this installation's flotilla.dev/install");
    let id = identity(&args);
    let metrics = Metrics::default();
    let probes = Probes::default();

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term => {},
        }
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let listener = listen(args.probe_addr)
        .await
        .with_context(|| format!("--probe-addr {}: cannot listen there (in use?)", args.probe_addr))?;
    let server = tokio::spawn(serve(listener, probes.clone(), metrics.clone(), stopped(stop_rx.clone())));

    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.lease_name)
        .with_namespace(&args.lease_namespace)
        .with_identity(&id)
        .with_duration(args.lease_duration)
        .with_grace((args.lease_duration / 3).max(1))
        .build()
        .await
        .context("setting up the leader lease")?;
    let (mut leader_rx, lease_task) = manager.watch().await;
    tracing::info!(identity = %id, lease = %args.lease_name, "waiting for leadership");
    probes.ready.store(true, Ordering::Relaxed); // a standby is ready: it is doing its job

    let config = ControllerConfig {
        poll: Duration::from_secs(args.poll_seconds),
        timeouts: flotilla_controllers::member::Timeouts {
            connect: Duration::from_secs(args.member_timeout_seconds.min(3)),
            observe: Duration::from_secs(args.member_timeout_seconds),
        },
        field_manager: "flotilla-controller".into(),
        capacity,
        stage_image: args.stage_image.clone(),
        stage_instance_metadata: args.stage_allow_instance_metadata,
        tenancy: flotilla_controllers::tenancy::Tenancy::new(
            [args.lease_namespace.clone(), args.member_secret_namespace.clone()],
            args.tenant_namespaces.clone(),
        ),
        sweep_every: Duration::from_secs(args.sweep_seconds),
        sweep_max_share: args.sweep_max_share,
        sweep_grace: Duration::from_secs(args.sweep_grace_seconds),
        replan_check_every: args.replan_check_every,
        replan_check_dir: args.replan_check_dir.clone().unwrap_or_else(std::env::temp_dir),
        install_id,
        heartbeat_every: Duration::from_secs(args.heartbeat_seconds),
        unschedulable_after: Duration::from_secs(args.unschedulable_seconds),
        unschedulable_backoff: Duration::from_secs(args.unschedulable_backoff_seconds),
        deployment_concurrency: args.deployment_concurrency,
        secret_namespace: args.member_secret_namespace.clone(),
        cluster_profile_providers: profile_providers,
    };
    let mut running: Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)> = None;
    let mut stop = stop_rx.clone();
    loop {
        let leader = *leader_rx.borrow_and_update();
        metrics.set_leader(leader);
        match (leader, running.is_some()) {
            (true, false) => {
                tracing::info!(identity = %id, "became leader: starting reconcilers");
                let (tx, rx) = watch::channel(false);
                let (client, config, metrics, probes) =
                    (client.clone(), config.clone(), metrics.clone(), probes.clone());
                let handle = tokio::spawn(async move {
                    run_controllers(client, config, metrics, stopped(rx), move || {
                        probes.ready.store(true, Ordering::Relaxed);
                    })
                    .await;
                });
                running = Some((tx, handle));
            }
            (false, true) => {
                tracing::warn!(identity = %id, "lost leadership: stopping reconcilers");
                if let Some((tx, handle)) = running.take() {
                    let _ = tx.send(true);
                    handle.abort();
                }
            }
            _ => {}
        }
        tokio::select! {
            changed = leader_rx.changed() => if changed.is_err() { break },
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    tracing::info!("shutting down");
    if let Some((tx, handle)) = running.take() {
        let _ = tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
    }
    drop(leader_rx); // closing the channel makes the lease task release the lease and finish
    if let Ok(Ok(Ok(manager))) = tokio::time::timeout(Duration::from_secs(5), lease_task).await {
        let _ = manager.release().await;
    }
    let _ = server.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::{CommandFactory, Parser};

    use super::Args;

    #[test]
    fn flags_are_consistent_and_the_two_provider_files_exclude_each_other() {
        Args::command().debug_assert();
        let args = Args::try_parse_from(["flotilla-controller", "--capacity-provider", "/etc/flotilla/providers.yaml"])
            .unwrap();
        assert_eq!(args.capacity_provider.unwrap().to_str(), Some("/etc/flotilla/providers.yaml"));
        let e = Args::try_parse_from(["flotilla-controller", "--capacity-provider", "a", "--sim-cloud", "b"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be used with"), "{e}");
    }
}
