//! The control-cluster objects a member is reached through — kubeconfig Secrets and
//! ClusterProfiles — from watches, never a GET per reconcile. One watch per object an
//! InferenceCluster names (`metadata.name` field selector in its namespace), started the first
//! time it is asked for and kept while some cluster names it. A field-selected list/watch is
//! what RBAC `resourceNames` can allow, so the chart's narrowest grant
//! (`controller.memberSecrets.names`) works as well as a whole namespace; an object in a
//! namespace the controller may not read (a `secretRef` naming one outside
//! `controller.memberSecrets.namespaces`) is refused by the API server, and that watch stops at
//! once with `Forbidden`; a kind the control cluster does not serve (the ClusterProfile CRD not
//! installed: HTTP 404) stops it with `NotServed`. Either is tried again on the next ask after
//! [`RETRY`] (or [`RETRY_NOT_SERVED`]), not in a loop. Stored objects keep only what is read
//! (`strip::secret`, `profiles::strip`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use super::{AbortOnDrop, watch_error};

/// After a refused watch, the next ask waits this long before trying again.
pub const RETRY: Duration = Duration::from_secs(30);
/// After a watch of a kind the control cluster does not serve, the next ask waits this long
/// (installing a CRD is a deliberate step whose effect users wait for).
pub const RETRY_NOT_SERVED: Duration = Duration::from_secs(10);

/// Why an object could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretError {
    /// The control cluster refused (HTTP 403).
    Forbidden,
    /// The control cluster does not serve the kind (HTTP 404 on the list: CRD not installed).
    NotServed,
    /// The control cluster did not answer in time, or failed otherwise.
    Unavailable(String),
}

/// How a watch stopped for good (until the next ask after the retry delay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Forbidden,
    NotServed,
}

/// A watch's last failure: `Some(stop)` when it stopped for good, and what happened.
type Failure = Arc<Mutex<Option<(Option<Stop>, String)>>>;

/// The watches of one kind, by `(namespace, name)`.
type ByName<K> = Mutex<HashMap<(String, String), Arc<Watch<K>>>>;

/// What a watch by name can hold: a namespaced object that kube can list, watch and store.
pub trait Watchable:
    kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Watchable for K where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

struct Watch<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    /// The watch's last failure; `Some((Some(stop), _))` when it stopped.
    failure: Failure,
    started: Instant,
    _task: AbortOnDrop,
}

impl<K: Watchable> Watch<K> {
    fn start(client: &Client, ns: &str, name: &str, strip: fn(&mut K)) -> Self {
        let api: Api<K> = Api::namespaced(client.clone(), ns);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (store, writer) = reflector::store::<K>();
        let failure: Failure = Arc::default();
        let f = failure.clone();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, config).default_backoff().modify(strip).reflect(writer));
            while let Some(event) = events.next().await {
                let stop = match &event {
                    Err(
                        watcher::Error::InitialListFailed(kube::Error::Api(s))
                        | watcher::Error::WatchStartFailed(kube::Error::Api(s)),
                    ) if s.code == 403 => Some(Some(Stop::Forbidden)),
                    Err(
                        watcher::Error::InitialListFailed(kube::Error::Api(s))
                        | watcher::Error::WatchStartFailed(kube::Error::Api(s)),
                    ) if s.code == 404 => Some(Some(Stop::NotServed)),
                    Err(_) => Some(None),
                    Ok(_) => None,
                };
                if let Ok(mut slot) = f.lock() {
                    *slot = match (stop, &event) {
                        (Some(s), Err(e)) => Some((s, watch_error(e))),
                        _ => None,
                    };
                }
                if matches!(stop, Some(Some(_))) {
                    // Stopped: the writer goes, so a waiting reader returns at once.
                    return;
                }
            }
        });
        Self { store, failure, started: Instant::now(), _task: AbortOnDrop(task) }
    }
}

impl<K: kube::Resource<DynamicType = ()> + 'static> Watch<K> {
    fn stopped(&self) -> Option<Stop> {
        self.failure.lock().ok().and_then(|f| f.as_ref().and_then(|(s, _)| *s))
    }

    /// Whether the next ask should start the watch again.
    fn stale(&self) -> bool {
        match self.stopped() {
            Some(Stop::Forbidden) => self.started.elapsed() >= RETRY,
            Some(Stop::NotServed) => self.started.elapsed() >= RETRY_NOT_SERVED,
            None => false,
        }
    }
}

/// Watches by name of one namespaced kind.
pub struct NamedWatches<K: kube::Resource<DynamicType = ()> + 'static> {
    watches: ByName<K>,
    strip: fn(&mut K),
}

/// The kubeconfig Secrets' watches.
pub type SecretWatches = NamedWatches<Secret>;

impl Default for SecretWatches {
    fn default() -> Self {
        Self::new(super::strip::secret)
    }
}

impl<K: Watchable> NamedWatches<K> {
    /// No watches yet; stored objects go through `strip`.
    pub fn new(strip: fn(&mut K)) -> Self {
        Self { watches: Mutex::default(), strip }
    }

    /// The object `ns/name` as its watch holds it (`None`: it does not exist), waiting at most
    /// `wait` for the watch's first list.
    pub async fn get(
        &self,
        control: &Client,
        ns: &str,
        name: &str,
        wait: Duration,
    ) -> Result<Option<Arc<K>>, SecretError> {
        let key = (ns.to_string(), name.to_string());
        let watch = {
            let Ok(mut watches) = self.watches.lock() else {
                return Err(SecretError::Unavailable("internal lock poisoned".into()));
            };
            if watches.get(&key).is_some_and(|w| w.stale()) {
                watches.remove(&key);
            }
            let strip = self.strip;
            watches.entry(key).or_insert_with(|| Arc::new(Watch::start(control, ns, name, strip))).clone()
        };
        let synced = tokio::time::timeout(wait, watch.store.wait_until_ready()).await;
        match (synced, watch.stopped()) {
            (Ok(Ok(())), _) => Ok(watch.store.state().into_iter().find(|s| s.meta().name.as_deref() == Some(name))),
            (_, Some(Stop::Forbidden)) => Err(SecretError::Forbidden),
            (_, Some(Stop::NotServed)) => Err(SecretError::NotServed),
            _ => {
                let why = watch.failure.lock().ok().and_then(|f| f.as_ref().map(|(_, w)| w.clone()));
                Err(SecretError::Unavailable(
                    why.unwrap_or_else(|| "the control cluster did not answer in time".into()),
                ))
            }
        }
    }
}

impl<K: kube::Resource<DynamicType = ()> + 'static> NamedWatches<K> {
    /// Stops the watches of objects not in `keep` (`(namespace, name)`).
    pub fn retain(&self, keep: &std::collections::HashSet<(String, String)>) {
        if let Ok(mut watches) = self.watches.lock() {
            watches.retain(|k, _| keep.contains(k));
        }
    }

    /// How many objects are watched.
    pub fn len(&self) -> usize {
        self.watches.lock().map(|w| w.len()).unwrap_or(0)
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
