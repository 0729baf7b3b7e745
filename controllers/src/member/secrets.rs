//! Member kubeconfig Secrets from watches on the control cluster, never a GET per reconcile.
//! One watch per Secret an InferenceCluster names (`metadata.name` field selector in the
//! `secretRef`'s namespace), started the first time it is asked for and kept while some
//! cluster names it. A field-selected list/watch is what RBAC `resourceNames` can allow, so the
//! chart's narrowest grant (`controller.memberSecrets.names`) works as well as a whole
//! namespace; a Secret in a namespace the controller may not read (a `secretRef` naming one
//! outside `controller.memberSecrets.namespaces`) is refused by the API server, and that watch
//! stops at once with `Forbidden` (it is tried again on the next ask after [`RETRY`], not in a
//! loop). Stored Secrets keep only their data (`strip::secret`).

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

/// Why a Secret could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretError {
    /// The control cluster refused (HTTP 403).
    Forbidden,
    /// The control cluster did not answer in time, or failed otherwise.
    Unavailable(String),
}

struct Watch {
    store: Store<Secret>,
    /// The watch's last failure; `Some((true, _))` when it was refused and stopped.
    failure: Arc<Mutex<Option<(bool, String)>>>,
    started: Instant,
    _task: AbortOnDrop,
}

impl Watch {
    fn start(client: &Client, ns: &str, name: &str) -> Self {
        let api: Api<Secret> = Api::namespaced(client.clone(), ns);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (store, writer) = reflector::store::<Secret>();
        let failure: Arc<Mutex<Option<(bool, String)>>> = Arc::default();
        let f = failure.clone();
        let task = tokio::spawn(async move {
            let mut events =
                std::pin::pin!(watcher(api, config).default_backoff().modify(super::strip::secret).reflect(writer));
            while let Some(event) = events.next().await {
                let refused = match &event {
                    Err(
                        watcher::Error::InitialListFailed(kube::Error::Api(s))
                        | watcher::Error::WatchStartFailed(kube::Error::Api(s)),
                    ) if s.code == 403 => Some(true),
                    Err(_) => Some(false),
                    Ok(_) => None,
                };
                if let Ok(mut slot) = f.lock() {
                    *slot = match (refused, &event) {
                        (Some(r), Err(e)) => Some((r, watch_error(e))),
                        _ => None,
                    };
                }
                if refused == Some(true) {
                    // Refused: stop (the writer goes, so a waiting reader returns at once).
                    return;
                }
            }
        });
        Self { store, failure, started: Instant::now(), _task: AbortOnDrop(task) }
    }

    fn refused(&self) -> bool {
        self.failure.lock().ok().and_then(|f| f.as_ref().map(|(r, _)| *r)).unwrap_or(false)
    }
}

/// The kubeconfig Secrets' watches.
#[derive(Default)]
pub struct SecretWatches {
    watches: Mutex<HashMap<(String, String), Arc<Watch>>>,
}

impl SecretWatches {
    /// The Secret `ns/name` as its watch holds it (`None`: it does not exist), waiting at most
    /// `wait` for the watch's first list.
    pub async fn get(
        &self,
        control: &Client,
        ns: &str,
        name: &str,
        wait: Duration,
    ) -> Result<Option<Arc<Secret>>, SecretError> {
        let key = (ns.to_string(), name.to_string());
        let watch = {
            let Ok(mut watches) = self.watches.lock() else {
                return Err(SecretError::Unavailable("internal lock poisoned".into()));
            };
            let stale = watches.get(&key).is_some_and(|w| w.refused() && w.started.elapsed() >= RETRY);
            if stale {
                watches.remove(&key);
            }
            watches.entry(key).or_insert_with(|| Arc::new(Watch::start(control, ns, name))).clone()
        };
        let synced = tokio::time::timeout(wait, watch.store.wait_until_ready()).await;
        match synced {
            Ok(Ok(())) => Ok(watch.store.state().into_iter().find(|s| s.metadata.name.as_deref() == Some(name))),
            _ if watch.refused() => Err(SecretError::Forbidden),
            _ => {
                let why = watch.failure.lock().ok().and_then(|f| f.as_ref().map(|(_, w)| w.clone()));
                Err(SecretError::Unavailable(
                    why.unwrap_or_else(|| "the control cluster did not answer in time".into()),
                ))
            }
        }
    }

    /// Stops the watches of Secrets not in `keep` (`(namespace, name)`).
    pub fn retain(&self, keep: &std::collections::HashSet<(String, String)>) {
        if let Ok(mut watches) = self.watches.lock() {
            watches.retain(|k, _| keep.contains(k));
        }
    }

    /// How many Secrets are watched.
    pub fn len(&self) -> usize {
        self.watches.lock().map(|w| w.len()).unwrap_or(0)
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
