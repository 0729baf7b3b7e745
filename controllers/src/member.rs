//! Member-cluster access. The kubeconfig Secret named by an `InferenceCluster`, or the
//! ClusterProfile it names resolved against the provider file (`profiles.rs`), comes from a
//! watch on the control cluster (`secrets.rs`, no GET per reconcile; `source.rs`) and becomes
//! two kube clients, rebuilt only when what they are built from changes (the Secret's
//! `resourceVersion`, the resolved profile's fingerprint; a bad or missing source reports its
//! reason and keeps the clients and watches already running): a *request* client for
//! apply, delete and the liveness check, whose calls are bounded (`Timeouts`), and a *watch*
//! client without a read timeout, which would break idle watches (the watcher bounds each
//! watch with a server-side timeout and finds dead connections itself). Member state comes
//! from watches only: inventory's (`watch.rs`) and Flotilla's own objects (`objects.rs`), all
//! stripped to what is read (`strip.rs`), with what Flotilla wrote and the caches do not show
//! yet in a memo (`memo.rs`). Every failure is classified (`SecretMissing`, `SecretInvalid`,
//! the ClusterProfile reasons, `ExecPluginFailed`, `Unauthorized`, `Unreachable`) with a message
//! that never carries the credentials themselves. Clients are built off the async runtime and
//! bounded in time: building one runs an exec credential plugin, if the kubeconfig has one.
//! A member that stops answering is found by the liveness check every poll; reachability is
//! logged per member on change only: WARN when it stops answering, INFO when it answers again,
//! DEBUG in between (kube-client's own per-request ERROR lines are turned off by `log_filter`).

pub mod memo;
pub mod objects;
pub mod profiles;
pub mod secrets;
pub mod source;
pub mod staging;
pub mod strip;
pub mod watch;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_apis::InferenceCluster;
use flotilla_apis::constants::reason;
use kube::Client;

pub use objects::MemberObjects;
pub use watch::MemberWatch;

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
    /// The ClusterProfile does not exist, or may not be read.
    #[error("{0}")]
    ClusterProfileNotFound(String),
    /// The control cluster does not serve ClusterProfiles.
    #[error("{0}")]
    ClusterProfileCrdMissing(String),
    /// No access provider of the profile is in the provider file.
    #[error("{0}")]
    NoMatchingAccessProvider(String),
    /// The matching access provider's cluster block is unusable.
    #[error("{0}")]
    ClusterProfileInvalid(String),
    /// The exec credential plugin failed.
    #[error("{0}")]
    ExecPluginFailed(String),
}

impl MemberError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SecretMissing(_) => reason::SECRET_MISSING,
            Self::SecretInvalid(_) => reason::SECRET_INVALID,
            Self::Unauthorized(_) => reason::UNAUTHORIZED,
            Self::Unreachable(_) => reason::UNREACHABLE,
            Self::ClusterProfileNotFound(_) => reason::CLUSTER_PROFILE_NOT_FOUND,
            Self::ClusterProfileCrdMissing(_) => reason::CLUSTER_PROFILE_CRD_MISSING,
            Self::NoMatchingAccessProvider(_) => reason::NO_MATCHING_ACCESS_PROVIDER,
            Self::ClusterProfileInvalid(_) => reason::CLUSTER_PROFILE_INVALID,
            Self::ExecPluginFailed(_) => reason::EXEC_PLUGIN_FAILED,
        }
    }
}

/// How long one member call may take before the member counts as unreachable.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// TCP connect.
    pub connect: Duration,
    /// One request (read and write timeout of the request client), and how long a reconcile
    /// waits for a cache's first sync.
    pub observe: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { connect: Duration::from_secs(3), observe: Duration::from_secs(8) }
    }
}

/// The server-side timeout of every member watch (`timeoutSeconds`): the server ends the watch
/// then and the watcher starts the next one from where it was (no LIST). The watcher counts a
/// watch silent for this long plus a margin as dead.
pub const WATCH_TIMEOUT_SECS: u32 = 290;

/// A member's clients, its object caches and, once inventory asked for them, its inventory
/// watches; valid for one version of what they were built from (`source::Fetched::version`).
struct Member {
    source_version: String,
    client: Client,
    watch_client: Client,
    objects: Arc<MemberObjects>,
    watch: Option<Arc<MemberWatch>>,
}

/// What a reconcile needs of one member: its request client and its caches.
#[derive(Clone)]
pub struct Handle {
    /// The request client (bounded calls: apply, delete, liveness).
    pub client: Client,
    /// Flotilla's objects there, from watches.
    pub objects: Arc<MemberObjects>,
}

/// Member clients and watches, cached by cluster and Secret version.
pub struct MemberClients {
    cache: Mutex<HashMap<String, Member>>,
    /// Namespace of kubeconfig Secrets whose `secretRef` names none.
    default_namespace: String,
    /// Per member, whether its last liveness check answered.
    reachable: Mutex<HashMap<String, bool>>,
    /// The kubeconfig Secrets, from watches.
    secrets: secrets::SecretWatches,
    /// The ClusterProfiles, from watches.
    profiles: secrets::NamedWatches<profiles::ClusterProfile>,
    /// The provider file ClusterProfiles are resolved against.
    providers: Option<Arc<profiles::ProviderFile>>,
    /// Per cluster, the Secret or ClusterProfile it names.
    refs: Mutex<HashMap<String, source::Ref>>,
    /// Clusters whose clients are being built (an exec plugin may hang: one at a time).
    building: Arc<Mutex<HashSet<String>>>,
}

impl Default for MemberClients {
    fn default() -> Self {
        Self::new(DEFAULT_SECRET_NAMESPACE)
    }
}

/// The member's handle once `built` is done: the cached member when one built from the same
/// source got there first (a build that finished while this one ran: the handle everyone else
/// already holds, with its watches and what the sweep noted, stays the only one), else `built`,
/// cached in place of an older one.
fn adopt(cache: &mut HashMap<String, Member>, name: String, built: Member) -> Handle {
    if let Some(m) = cache.get(&name) {
        if m.source_version == built.source_version {
            return Handle { client: m.client.clone(), objects: m.objects.clone() };
        }
        tracing::info!(cluster = %name, "member credentials changed: member clients and watches started again");
    }
    let handle = Handle { client: built.client.clone(), objects: built.objects.clone() };
    cache.insert(name, built);
    handle
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
        Self {
            cache: Mutex::default(),
            default_namespace: default_namespace.into(),
            reachable: Mutex::default(),
            secrets: secrets::SecretWatches::default(),
            profiles: secrets::NamedWatches::new(profiles::strip),
            providers: None,
            refs: Mutex::default(),
            building: Arc::default(),
        }
    }

    /// ClusterProfiles are resolved against `providers` (none: every profile reports
    /// `NoMatchingAccessProvider`).
    pub fn with_cluster_profile_providers(mut self, providers: Option<Arc<profiles::ProviderFile>>) -> Self {
        self.providers = providers;
        self
    }

    /// The request client for a member, built from its kubeconfig Secret or ClusterProfile.
    pub async fn client(&self, control: &Client, ic: &InferenceCluster, t: Timeouts) -> Result<Client, MemberError> {
        Ok(self.handle(control, ic, t).await?.client)
    }

    /// The member's request client and object caches, built from its kubeconfig Secret or
    /// ClusterProfile (read from their watches; the clients are built again only when what
    /// they are built from changed). When that cannot be read or used, the error says why and
    /// the clients and watches already running stay as they are.
    pub async fn handle(&self, control: &Client, ic: &InferenceCluster, t: Timeouts) -> Result<Handle, MemberError> {
        let name = ic.metadata.name.clone().unwrap_or_default();
        let r = source::reference(ic, &self.default_namespace);
        if let (Ok(mut refs), Some(r)) = (self.refs.lock(), &r) {
            refs.insert(name.clone(), r.clone());
        }
        let sources =
            source::Sources { secrets: &self.secrets, profiles: &self.profiles, providers: self.providers.as_deref() };
        let fetched = source::fetch(&sources, control, ic, r.as_ref(), t.observe).await?;
        let version = fetched.version();
        if let Ok(cache) = self.cache.lock()
            && let Some(m) = cache.get(&name)
            && m.source_version == version
        {
            return Ok(Handle { client: m.client.clone(), objects: m.objects.clone() });
        }
        let (client, watch_client) = source::clients(&fetched, &name, &self.building, t).await?;
        let objects = Arc::new(MemberObjects::new(watch_client.clone()));
        let m = Member {
            source_version: version,
            client: client.clone(),
            watch_client,
            objects: objects.clone(),
            watch: None,
        };
        match self.cache.lock() {
            Ok(mut cache) => Ok(adopt(&mut cache, name, m)),
            Err(_) => Ok(Handle { client, objects }),
        }
    }

    /// Whether the last liveness check of member `cluster` failed (the InferenceCluster
    /// reconciler runs one every poll): reconciles then leave it alone at once instead of each
    /// waiting out the member timeout.
    pub fn known_unreachable(&self, cluster: &str) -> bool {
        self.reachable.lock().ok().is_some_and(|m| m.get(cluster) == Some(&false))
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

    /// Drops the clients, caches and watches (and the Secret watches) of clusters not in
    /// `keep`; returns their names.
    pub fn retain(&self, keep: &HashSet<String>) -> Vec<String> {
        if let Ok(mut r) = self.reachable.lock() {
            r.retain(|k, _| keep.contains(k));
        }
        if let Ok(mut refs) = self.refs.lock() {
            refs.retain(|k, _| keep.contains(k));
            let (mut secrets, mut profiles) = (HashSet::new(), HashSet::new());
            for r in refs.values() {
                match r {
                    source::Ref::Secret(ns, n) => secrets.insert((ns.clone(), n.clone())),
                    source::Ref::Profile(ns, n) => profiles.insert((ns.clone(), n.clone())),
                };
            }
            self.secrets.retain(&secrets);
            self.profiles.retain(&profiles);
        }
        let Ok(mut cache) = self.cache.lock() else { return Vec::new() };
        let mut gone: Vec<String> = cache.keys().filter(|k| !keep.contains(*k)).cloned().collect();
        gone.sort();
        for name in &gone {
            cache.remove(name);
        }
        gone
    }

    /// The member's inventory watches (started on first use, kept while its Secret does not
    /// change); `client` is its request client.
    pub async fn watch(&self, cluster: &str, client: &Client, t: Timeouts) -> Result<Arc<MemberWatch>, MemberError> {
        let watch_client = {
            let Ok(cache) = self.cache.lock() else {
                return Err(MemberError::Unreachable("internal lock poisoned".into()));
            };
            let Some(m) = cache.get(cluster) else {
                return Err(MemberError::Unreachable("no client for this member yet".into()));
            };
            if let Some(w) = m.watch.clone() {
                return Ok(w);
            }
            m.watch_client.clone()
        };
        let w = Arc::new(MemberWatch::start(client, &watch_client, t).await?);
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

/// A watch error's gist (as `brief`).
pub(crate) fn watch_error(e: &kube::runtime::watcher::Error) -> String {
    use kube::runtime::watcher::Error as W;
    match e {
        W::InitialListFailed(k) | W::WatchStartFailed(k) | W::WatchFailed(k) => brief(k),
        W::WatchError(s) => format!("HTTP {} {}", s.code, s.reason),
        other => other.to_string().chars().take(160).collect(),
    }
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
            "the member API server refused the credentials (HTTP {}): renew the kubeconfig in the Secret, or \
             check what the ClusterProfile's exec plugin returns",
            s.code
        )),
        // A refresh of an exec plugin's expired credential failed.
        kube::Error::Auth(_) => MemberError::ExecPluginFailed(profiles::exec_failure(e, None)),
        _ => MemberError::Unreachable(format!("the member API server did not answer: {}", brief(e))),
    }
}

#[cfg(test)]
mod retain_tests {
    use kube::Config;

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

    fn member(client: &Client) -> Member {
        Member {
            source_version: "1".into(),
            client: client.clone(),
            watch_client: client.clone(),
            objects: Arc::new(MemberObjects::new(client.clone())),
            watch: None,
        }
    }

    #[tokio::test]
    async fn a_build_that_finished_second_from_the_same_source_adopts_the_first() {
        crate::install_crypto();
        let client = Client::try_from(Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let mut cache = HashMap::new();
        let first = adopt(&mut cache, "eu1".into(), member(&client));
        // Two callers missed the cache together and both built: the second to finish gets the
        // first's objects (its watches, and the sweep's "swept once"), which stay cached.
        first.objects.swept_once.store(true, std::sync::atomic::Ordering::Relaxed);
        let second = adopt(&mut cache, "eu1".into(), member(&client));
        assert!(Arc::ptr_eq(&first.objects, &second.objects), "one member, one set of objects");
        assert!(Arc::ptr_eq(&cache["eu1"].objects, &first.objects));
        assert!(second.objects.swept_once.load(std::sync::atomic::Ordering::Relaxed));
        // New credentials (another source version): built again, in place of the old.
        let mut rotated = member(&client);
        rotated.source_version = "2".into();
        let third = adopt(&mut cache, "eu1".into(), rotated);
        assert!(!Arc::ptr_eq(&third.objects, &first.objects));
        assert!(Arc::ptr_eq(&cache["eu1"].objects, &third.objects));
    }

    #[tokio::test]
    async fn a_deleted_clusters_client_is_dropped_and_the_others_kept() {
        crate::install_crypto();
        let members = MemberClients::default();
        let client = Client::try_from(Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        for name in ["eu1", "eu2", "us1"] {
            members.cache.lock().unwrap().insert(name.to_string(), member(&client));
        }
        let keep = ["eu1".to_string(), "us1".to_string()].into_iter().collect();
        assert_eq!(members.retain(&keep), ["eu2"]);
        let mut left: Vec<String> = members.cache.lock().unwrap().keys().cloned().collect();
        left.sort();
        assert_eq!(left, ["eu1", "us1"]);
        assert!(members.retain(&keep).is_empty());
    }
}
