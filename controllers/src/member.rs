//! Member-cluster access: the kubeconfig Secret named by an `InferenceCluster` becomes a kube
//! `Client` (cached per Secret `resourceVersion`), and one observation lists what inventory
//! needs. Every failure is classified (`SecretMissing`, `SecretInvalid`, `Unauthorized`,
//! `Unreachable`) with a message that never carries the credentials themselves. Reachability
//! is logged per member on change only: WARN when it stops answering, INFO when it answers
//! again, DEBUG in between (kube-client's own per-request ERROR lines are turned off by
//! `log_filter`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_apis::InferenceCluster;
use flotilla_apis::constants::reason;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Config};

use crate::inventory::MemberObservation;

/// Namespace of the kubeconfig Secret when the spec names none and the controller was given
/// none (`--member-secret-namespace`).
pub const DEFAULT_SECRET_NAMESPACE: &str = "flotilla-system";
/// Key of the kubeconfig in the Secret when the spec names none.
pub const DEFAULT_SECRET_KEY: &str = "kubeconfig";

/// Why a member could not be observed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    /// The Secret does not exist (or the spec names none).
    #[error("{0}")]
    SecretMissing(String),
    /// The Secret holds no usable kubeconfig.
    #[error("{0}")]
    SecretInvalid(String),
    /// The member refused the credentials.
    #[error("{0}")]
    Unauthorized(String),
    /// The member did not answer.
    #[error("{0}")]
    Unreachable(String),
}

impl MemberError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SecretMissing(_) => reason::SECRET_MISSING,
            Self::SecretInvalid(_) => reason::SECRET_INVALID,
            Self::Unauthorized(_) => reason::UNAUTHORIZED,
            Self::Unreachable(_) => reason::UNREACHABLE,
        }
    }
}

/// How long one member call may take before the member counts as unreachable.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// TCP connect.
    pub connect: Duration,
    /// A whole observation (all list calls).
    pub observe: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { connect: Duration::from_secs(3), observe: Duration::from_secs(8) }
    }
}

/// A member's client and, once inventory asked for it, its watches; valid for one version of
/// the kubeconfig Secret.
struct Member {
    secret_version: String,
    client: Client,
    watch: Option<Arc<MemberWatch>>,
}

/// Member clients and watches, cached by cluster and Secret version.
pub struct MemberClients {
    cache: Mutex<HashMap<String, Member>>,
    /// Namespace of kubeconfig Secrets whose `secretRef` names none.
    default_namespace: String,
    /// Per member, whether its last liveness check answered.
    reachable: Mutex<HashMap<String, bool>>,
}

impl Default for MemberClients {
    fn default() -> Self {
        Self::new(DEFAULT_SECRET_NAMESPACE)
    }
}

/// What a liveness result means for the log, given the member's previous one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reachability {
    /// It stopped answering (or never answered since the start): WARN, once.
    Lost,
    /// It answers again: INFO, once.
    Recovered,
    /// As before: DEBUG.
    Unchanged,
}

/// The log decision for a member that `answers` now and answered `before` (`None`: not checked
/// yet). Pure.
pub fn reachability(before: Option<bool>, answers: bool) -> Reachability {
    match (before, answers) {
        (Some(false), true) => Reachability::Recovered,
        (Some(true) | None, false) => Reachability::Lost,
        _ => Reachability::Unchanged,
    }
}

/// The tracing filter: `rust_log` (else `info`) with kube-client's per-request failure lines
/// off — it logs every failed HTTP request at ERROR, which for a member that is down is one
/// line per poll and per watch retry. Naming `kube_client` in `RUST_LOG` keeps them.
pub fn log_filter(rust_log: Option<&str>) -> String {
    let base = rust_log.filter(|s| !s.trim().is_empty()).unwrap_or("info");
    if base.contains("kube_client") { base.to_string() } else { format!("{base},kube_client::client::builder=off") }
}

impl MemberClients {
    /// No clients yet; `secretRef`s without a namespace name a Secret in `default_namespace`.
    pub fn new(default_namespace: impl Into<String>) -> Self {
        Self { cache: Mutex::default(), default_namespace: default_namespace.into(), reachable: Mutex::default() }
    }

    /// The client for a member, built from its kubeconfig Secret.
    pub async fn client(&self, control: &Client, ic: &InferenceCluster, t: Timeouts) -> Result<Client, MemberError> {
        let name = ic.metadata.name.clone().unwrap_or_default();
        let Some(creds) = &ic.spec.credentials else {
            return Err(MemberError::SecretMissing(
                "spec.credentials.secretRef is not set: name the Secret holding the member's kubeconfig".into(),
            ));
        };
        let r = &creds.secret_ref;
        let ns = r.namespace.as_deref().unwrap_or(&self.default_namespace);
        let key = r.key.as_deref().unwrap_or(DEFAULT_SECRET_KEY);
        let secrets: Api<Secret> = Api::namespaced(control.clone(), ns);
        let secret = match secrets.get_opt(&r.name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(MemberError::SecretMissing(format!(
                    "Secret {ns}/{} does not exist: create it with the member's kubeconfig under key {key:?}",
                    r.name
                )));
            }
            Err(e) => return Err(MemberError::Unreachable(format!("reading Secret {ns}/{}: {}", r.name, brief(&e)))),
        };
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        if let Ok(cache) = self.cache.lock()
            && let Some(m) = cache.get(&name)
            && m.secret_version == version
        {
            return Ok(m.client.clone());
        }
        let bytes = secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.clone());
        let Some(bytes) = bytes else {
            return Err(MemberError::SecretInvalid(format!("Secret {ns}/{} has no key {key:?}", r.name)));
        };
        let invalid = |what: &str| MemberError::SecretInvalid(format!("Secret {ns}/{} key {key:?}: {what}", r.name));
        let text = String::from_utf8(bytes).map_err(|_| invalid("not UTF-8 text"))?;
        let kubeconfig = Kubeconfig::from_yaml(&text).map_err(|_| invalid("not a kubeconfig"))?;
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|_| invalid("the kubeconfig has no usable context, cluster or user"))?;
        config.connect_timeout = Some(t.connect);
        config.read_timeout = Some(t.observe);
        config.write_timeout = Some(t.observe);
        crate::install_crypto();
        let client = Client::try_from(config).map_err(|_| invalid("cannot build a client from it"))?;
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(name, Member { secret_version: version, client: client.clone(), watch: None });
        }
        Ok(client)
    }

    /// The liveness check (`liveness`) of member `cluster`, logged when its reachability changes.
    pub async fn liveness(&self, cluster: &str, client: &Client, t: Timeouts) -> Result<String, MemberError> {
        let result = liveness(client, t).await;
        let before = self.reachable.lock().ok().and_then(|mut m| m.insert(cluster.to_string(), result.is_ok()));
        match (reachability(before, result.is_ok()), &result) {
            (Reachability::Lost, Err(e)) => tracing::warn!(cluster, reason = e.reason(), "member unreachable: {e}"),
            (Reachability::Recovered, _) => tracing::info!(cluster, "member reachable again"),
            (_, Err(e)) => tracing::debug!(cluster, "member still unreachable: {e}"),
            (_, Ok(_)) => tracing::debug!(cluster, "member answers"),
        }
        result
    }

    /// Drops the clients and watches of clusters not in `keep`; returns their names.
    pub fn retain(&self, keep: &std::collections::HashSet<String>) -> Vec<String> {
        if let Ok(mut r) = self.reachable.lock() {
            r.retain(|k, _| keep.contains(k));
        }
        let Ok(mut cache) = self.cache.lock() else { return Vec::new() };
        let mut gone: Vec<String> = cache.keys().filter(|k| !keep.contains(*k)).cloned().collect();
        gone.sort();
        for name in &gone {
            cache.remove(name);
        }
        gone
    }

    /// The member's watches (started on first use, kept while its Secret does not change).
    pub async fn watch(&self, cluster: &str, client: &Client, t: Timeouts) -> Result<Arc<MemberWatch>, MemberError> {
        if let Ok(cache) = self.cache.lock()
            && let Some(w) = cache.get(cluster).and_then(|m| m.watch.clone())
        {
            return Ok(w);
        }
        let w = Arc::new(MemberWatch::start(client, t).await?);
        if let Ok(mut cache) = self.cache.lock()
            && let Some(m) = cache.get_mut(cluster)
        {
            m.watch = Some(w.clone());
        }
        Ok(w)
    }
}

/// Aborts a task when dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn spawn_store<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, AbortOnDrop)
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let task = tokio::spawn(async move {
        reflector::reflector(writer, watcher(api, config)).default_backoff().for_each(|_| async {}).await;
    });
    (store, AbortOnDrop(task))
}

/// Watches on one member's nodes, non-terminal pods and — where it serves DRA —
/// ResourceSlices and ResourceClaims. Dropping it stops them.
pub struct MemberWatch {
    nodes: Store<Node>,
    pods: Store<Pod>,
    slices: Option<Store<ResourceSlice>>,
    claims: Option<Store<ResourceClaim>>,
    _tasks: Vec<AbortOnDrop>,
}

impl MemberWatch {
    async fn start(client: &Client, t: Timeouts) -> Result<Self, MemberError> {
        let slices_api = Api::<ResourceSlice>::all(client.clone());
        let one = ListParams::default().limit(1);
        let dra = match tokio::time::timeout(t.observe, slices_api.list(&one)).await {
            Ok(Ok(_)) => true,
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => false,
            Ok(Err(e)) => return Err(classify(&e)),
            Err(_) => return Err(MemberError::Unreachable("the member API server did not answer in time".into())),
        };
        let mut tasks = Vec::new();
        let (nodes, task) = spawn_store(Api::<Node>::all(client.clone()), watcher::Config::default());
        tasks.push(task);
        let running = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let (pods, task) = spawn_store(Api::<Pod>::all(client.clone()), running);
        tasks.push(task);
        let (slices, claims) = if dra {
            let (slices, task) = spawn_store(Api::<ResourceSlice>::all(client.clone()), watcher::Config::default());
            tasks.push(task);
            let (claims, task) = spawn_store(Api::<ResourceClaim>::all(client.clone()), watcher::Config::default());
            tasks.push(task);
            (Some(slices), Some(claims))
        } else {
            (None, None)
        };
        Ok(Self { nodes, pods, slices, claims, _tasks: tasks })
    }

    /// What the watches hold now; waits (bounded) for their first list.
    pub async fn observation(&self, t: Timeouts) -> Result<MemberObservation, MemberError> {
        let synced = async {
            let _ = self.nodes.wait_until_ready().await;
            let _ = self.pods.wait_until_ready().await;
            if let Some(s) = &self.slices {
                let _ = s.wait_until_ready().await;
            }
            if let Some(c) = &self.claims {
                let _ = c.wait_until_ready().await;
            }
        };
        if tokio::time::timeout(t.observe, synced).await.is_err() {
            return Err(MemberError::Unreachable(format!(
                "the member's watches did not sync within {} s",
                t.observe.as_secs()
            )));
        }
        Ok(MemberObservation {
            nodes: owned(&self.nodes),
            pods: owned(&self.pods),
            slices: self.slices.as_ref().map(owned).unwrap_or_default(),
            claims: self.claims.as_ref().map(owned).unwrap_or_default(),
        })
    }
}

fn owned<K: kube::Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> Vec<K> {
    store.state().into_iter().map(|a| (*a).clone()).collect()
}

/// Whether the member answers, and its version: the liveness check run on every poll.
pub async fn liveness(client: &Client, t: Timeouts) -> Result<String, MemberError> {
    match tokio::time::timeout(t.observe, client.apiserver_version()).await {
        Ok(Ok(info)) => Ok(info.git_version),
        Ok(Err(e)) => Err(classify(&e)),
        Err(_) => Err(MemberError::Unreachable(format!(
            "the member API server did not answer within {} s",
            t.observe.as_secs()
        ))),
    }
}

/// An error's gist: API status code and reason, or the transport failure, never a body that
/// could echo credentials.
pub fn brief(e: &kube::Error) -> String {
    match e {
        // The API server's own message says which field it refused (it never carries credentials).
        kube::Error::Api(s) if matches!(s.code, 400 | 409 | 422) && !s.message.is_empty() => {
            let causes: Vec<String> = s
                .details
                .iter()
                .flat_map(|d| &d.causes)
                .take(3)
                .map(|c| format!("{}: {}", c.field, c.message))
                .collect();
            let text = if causes.is_empty() { s.message.clone() } else { causes.join("; ") };
            format!("HTTP {} {}: {}", s.code, s.reason, text.chars().take(300).collect::<String>())
        }
        kube::Error::Api(s) => format!("HTTP {} {}", s.code, s.reason),
        kube::Error::HyperError(_) | kube::Error::Service(_) => "connection failed".into(),
        other => {
            let text = other.to_string();
            text.chars().take(160).collect()
        }
    }
}

fn classify(e: &kube::Error) -> MemberError {
    match e {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => MemberError::Unauthorized(format!(
            "the member API server refused the credentials (HTTP {}): renew the kubeconfig in the Secret",
            s.code
        )),
        _ => MemberError::Unreachable(format!("the member API server did not answer: {}", brief(e))),
    }
}

#[cfg(test)]
mod retain_tests {
    use super::*;

    #[test]
    fn reachability_is_logged_on_change_only() {
        use Reachability::*;
        // Down for a while, then back: one Lost, one Recovered, nothing loud in between.
        let polls = [true, true, false, false, false, true, true];
        let mut before = None;
        let seen: Vec<Reachability> = polls
            .iter()
            .map(|&now| {
                let r = reachability(before, now);
                before = Some(now);
                r
            })
            .collect();
        assert_eq!(seen, [Unchanged, Unchanged, Lost, Unchanged, Unchanged, Recovered, Unchanged]);
        assert_eq!(reachability(None, false), Lost, "down since the start is said once too");
    }

    #[test]
    fn kube_clients_per_request_errors_are_off_unless_asked_for() {
        assert_eq!(log_filter(None), "info,kube_client::client::builder=off");
        assert_eq!(log_filter(Some("debug")), "debug,kube_client::client::builder=off");
        assert_eq!(log_filter(Some("info,kube_client=debug")), "info,kube_client=debug");
    }

    #[tokio::test]
    async fn a_deleted_clusters_client_is_dropped_and_the_others_kept() {
        crate::install_crypto();
        let members = MemberClients::default();
        let client = Client::try_from(Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        for name in ["eu1", "eu2", "us1"] {
            members
                .cache
                .lock()
                .unwrap()
                .insert(name.to_string(), Member { secret_version: "1".into(), client: client.clone(), watch: None });
        }
        let keep = ["eu1".to_string(), "us1".to_string()].into_iter().collect();
        assert_eq!(members.retain(&keep), ["eu2"]);
        let mut left: Vec<String> = members.cache.lock().unwrap().keys().cloned().collect();
        left.sort();
        assert_eq!(left, ["eu1", "us1"]);
        assert!(members.retain(&keep).is_empty());
    }
}
