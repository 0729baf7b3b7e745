//! Reading the control cluster: the kubeconfig (`--kubeconfig`, else `$KUBECONFIG`, else
//! `~/.kube/config`, else in-cluster), the context (`--context`), a client with timeouts, and
//! lists of Flotilla objects. Every way of not getting them — no kubeconfig, an unreachable
//! server, refused credentials, missing CRDs — is a [`LiveError`] with a message saying what to
//! change, and exits with [`EXIT_UNREACHABLE`].

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use flotilla_apis::{CapacityClaim, FleetQuota, InferenceClass, InferenceCluster, ModelCache, ModelDeployment};
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde::de::DeserializeOwned;

use crate::overlay::LiveFleet;

/// The exit code when the live fleet cannot be read.
pub const EXIT_UNREACHABLE: u8 = 3;

/// How to reach the control cluster.
#[derive(Clone, Debug, Default, Args)]
pub struct ClusterArgs {
    /// Kubeconfig of the control cluster [default: $KUBECONFIG, else ~/.kube/config, else
    /// the in-cluster service account].
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use [default: its current context].
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Seconds to wait for the control cluster to connect and to answer each request.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub request_timeout: u64,
}

/// The live fleet could not be read.
#[derive(Debug)]
pub struct LiveError(pub String);

impl fmt::Display for LiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LiveError {}

/// An error and its causes, each said once.
fn chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// A connected control cluster.
#[derive(Clone)]
pub struct Control {
    /// The client.
    pub client: Client,
    /// The context's namespace (`default` when it names none).
    pub namespace: String,
    /// The API server's URL, for messages.
    pub server: String,
    timeout: Duration,
}

/// Builds a client for the control cluster. Nothing is sent yet.
pub async fn connect(args: &ClusterArgs) -> Result<Control, LiveError> {
    let options = KubeConfigOptions { context: args.context.clone(), cluster: None, user: None };
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| LiveError(format!("cannot read the kubeconfig {}: {}", path.display(), chain(&e))))?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| LiveError(format!("cannot use the kubeconfig {}: {}", path.display(), chain(&e))))?
        }
        None if args.context.is_some() => Config::from_kubeconfig(&options).await.map_err(|e| {
            LiveError(format!("cannot use the kubeconfig ($KUBECONFIG or ~/.kube/config): {}", chain(&e)))
        })?,
        None => Config::infer().await.map_err(|e| {
            LiveError(format!(
                "no control cluster configured (pass --kubeconfig, set KUBECONFIG, or write ~/.kube/config): {}",
                chain(&e)
            ))
        })?,
    };
    let timeout = Duration::from_secs(args.request_timeout.max(1));
    let mut config = config;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    let server = config.cluster_url.to_string();
    let namespace = config.default_namespace.clone();
    flotilla_apis::crypto::install_crypto();
    let client = Client::try_from(config)
        .map_err(|e| LiveError(format!("cannot build a client for {server}: {}", chain(&e))))?;
    Ok(Control { client, namespace, server: server.trim_end_matches('/').to_string(), timeout })
}

impl Control {
    fn error(&self, e: &kube::Error, what: &str) -> LiveError {
        let server = &self.server;
        LiveError(match e {
            kube::Error::Api(s) if s.code == 404 => format!(
                "{server} does not serve {what}: are the Flotilla CRDs installed? \
                 (fleetctl crds | kubectl apply --server-side -f -)"
            ),
            kube::Error::Api(s) if s.code == 401 => {
                format!("{server} refused the credentials (401 Unauthorized): check the kubeconfig's user")
            }
            kube::Error::Api(s) if s.code == 403 => {
                format!("not allowed to list {what} on {server} (403 Forbidden): {}", s.message)
            }
            kube::Error::Api(s) => format!("{server} answered {} {} listing {what}: {}", s.code, s.reason, s.message),
            other => format!("cannot reach the control cluster at {server}: {}", chain(other)),
        })
    }

    /// Lists objects, optionally only the one named `name`.
    pub async fn list<K>(&self, api: Api<K>, what: &str, name: Option<&str>) -> Result<Vec<K>, LiveError>
    where
        K: Clone + DeserializeOwned + fmt::Debug,
    {
        self.list_of(api, what, name, false).await
    }

    /// As [`Self::list`]; with `missing_ok`, a kind the API server does not serve (404) is empty.
    async fn list_of<K>(
        &self,
        api: Api<K>,
        what: &str,
        name: Option<&str>,
        missing_ok: bool,
    ) -> Result<Vec<K>, LiveError>
    where
        K: Clone + DeserializeOwned + fmt::Debug,
    {
        let mut lp = ListParams::default();
        if let Some(n) = name {
            lp = lp.fields(&format!("metadata.name={n}"));
        }
        match tokio::time::timeout(self.timeout, api.list(&lp)).await {
            Ok(Ok(list)) => Ok(list.items),
            Ok(Err(kube::Error::Api(s))) if missing_ok && s.code == 404 => Ok(Vec::new()),
            Ok(Err(e)) => Err(self.error(&e, what)),
            Err(_) => Err(LiveError(format!(
                "cannot reach the control cluster at {}: no answer listing {what} within {} s (--request-timeout)",
                self.server,
                self.timeout.as_secs()
            ))),
        }
    }

    /// An API for a namespaced kind: one namespace, or all of them when `None`.
    pub fn namespaced<K>(&self, namespace: Option<&str>) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// Every Flotilla object of the control cluster (deployments, caches, claims and quotas of
    /// every namespace), read concurrently.
    pub async fn fleet(&self) -> Result<LiveFleet, LiveError> {
        let c = &self.client;
        let (classes, clusters, deployments, caches, claims, quotas) = tokio::try_join!(
            self.list(Api::<InferenceClass>::all(c.clone()), "inferenceclasses.flotilla.dev", None),
            self.list(Api::<InferenceCluster>::all(c.clone()), "inferenceclusters.flotilla.dev", None),
            self.list(Api::<ModelDeployment>::all(c.clone()), "modeldeployments.flotilla.dev", None),
            self.list(Api::<ModelCache>::all(c.clone()), "modelcaches.flotilla.dev", None),
            self.list(Api::<CapacityClaim>::all(c.clone()), "capacityclaims.flotilla.dev", None),
            // None where the control cluster has no such CRD yet (installed before the kind).
            self.list_of(Api::<FleetQuota>::all(c.clone()), "fleetquotas.flotilla.dev", None, true),
        )?;
        Ok(LiveFleet { classes, clusters, deployments, caches, claims, quotas })
    }
}

/// Runs a future on a small runtime (the CLI is synchronous elsewhere).
pub fn block_on<F: std::future::Future>(f: F) -> anyhow::Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    Ok(rt.block_on(f))
}
