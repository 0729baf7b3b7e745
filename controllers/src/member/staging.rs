//! A member's caches of ModelCache staging objects: volume claims, Jobs, their pods and
//! (metadata only: the controller never holds a member Secret's data) Secrets carrying the
//! labels `flotilla.dev/cache` and Flotilla's managed-by. One watch per kind **per tenant
//! namespace** (the member grants Roles there, `examples/member-rbac`), started the first time
//! the ModelCache reconciler looks at that namespace of that member and kept for the member
//! client's life, so a settled cache is re-checked from memory: no LIST per look. A watch the
//! member refuses (403), one that is failing (the member stopped answering) or one that does
//! not sync in time gives no answer here ([`StagingWatches::synced`] is `None`) and the
//! reconciler lists instead, as it does without watches; a refused one is tried again after
//! [`RETRY`](super::objects::RETRY).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_apis::constants::labels;
use futures_util::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};

use super::objects::RETRY;
use super::{AbortOnDrop, WATCH_TIMEOUT_SECS};

/// Why a namespace's staging watches give no answer: (refused, what).
type Failure = Arc<Mutex<Option<(bool, String)>>>;

/// One tenant namespace's staging objects, from watches.
pub struct StagingNs {
    /// Volume claims.
    pub pvcs: Store<PersistentVolumeClaim>,
    /// Jobs.
    pub jobs: Store<Job>,
    /// The Jobs' pods.
    pub pods: Store<Pod>,
    /// Secrets, metadata only.
    pub secrets: Store<PartialObjectMeta<Secret>>,
    failure: Failure,
    started: Instant,
    _tasks: Vec<AbortOnDrop>,
}

/// The selector of every staging object.
fn selector() -> String {
    format!("{},{}=flotilla", labels::CACHE, labels::MANAGED_BY)
}

/// Runs one reflector into `writer`, recording failures (a 403 stops it) and clearing them
/// on the next event.
fn spawn<K>(
    events: impl futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    writer: reflector::store::Writer<K>,
    failure: Failure,
    what: String,
) -> AbortOnDrop
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    AbortOnDrop(tokio::spawn(async move {
        let mut events = std::pin::pin!(events.default_backoff().reflect(writer));
        while let Some(event) = events.next().await {
            match event {
                Ok(_) => {
                    if let Ok(mut f) = failure.lock() {
                        *f = None;
                    }
                }
                Err(e) => {
                    let refused = matches!(&e,
                        watcher::Error::InitialListFailed(kube::Error::Api(s))
                        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 403);
                    tracing::debug!("member staging cache: {what}: {}", super::watch_error(&e));
                    if let Ok(mut f) = failure.lock() {
                        *f = Some((refused, what.clone()));
                    }
                    if refused {
                        return;
                    }
                }
            }
        }
    }))
}

impl StagingNs {
    fn start(client: &Client, ns: &str) -> Self {
        let failure: Failure = Arc::default();
        let config = || watcher::Config::default().labels(&selector()).timeout(WATCH_TIMEOUT_SECS);
        let what = |kind: &str| format!("{kind} in namespace {ns}");
        let light = |m: &mut kube::api::ObjectMeta| m.managed_fields = None;
        let pvcs = reflector::store::Writer::default();
        let jobs = reflector::store::Writer::default();
        let pods = reflector::store::Writer::default();
        let secrets = reflector::store::Writer::default();
        let stores = (pvcs.as_reader(), jobs.as_reader(), pods.as_reader(), secrets.as_reader());
        let tasks = vec![
            spawn(
                watcher(Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns), config())
                    .modify(move |o| light(&mut o.metadata)),
                pvcs,
                failure.clone(),
                what("PersistentVolumeClaim"),
            ),
            spawn(
                watcher(Api::<Job>::namespaced(client.clone(), ns), config()).modify(move |o| light(&mut o.metadata)),
                jobs,
                failure.clone(),
                what("Job"),
            ),
            spawn(
                watcher(Api::<Pod>::namespaced(client.clone(), ns), config()).modify(move |o| light(&mut o.metadata)),
                pods,
                failure.clone(),
                what("Pod"),
            ),
            spawn(
                watcher(Api::<PartialObjectMeta<Secret>>::namespaced(client.clone(), ns), config())
                    .modify(move |o| light(&mut o.metadata)),
                secrets,
                failure.clone(),
                what("Secret"),
            ),
        ];
        let (pvcs, jobs, pods, secrets) = stores;
        Self { pvcs, jobs, pods, secrets, failure, started: Instant::now(), _tasks: tasks }
    }

    fn failed(&self) -> Option<(bool, String)> {
        self.failure.lock().ok()?.clone()
    }

    /// Synced within `wait` and no watch failing; a failure ends the wait at once.
    async fn ready(&self, wait: Duration) -> bool {
        let all = async {
            self.pvcs.wait_until_ready().await.is_ok()
                && self.jobs.wait_until_ready().await.is_ok()
                && self.pods.wait_until_ready().await.is_ok()
                && self.secrets.wait_until_ready().await.is_ok()
        };
        let mut all = std::pin::pin!(all);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                synced = &mut all => return synced && self.failed().is_none(),
                () = tokio::time::sleep(Duration::from_millis(50)) => {
                    if self.failed().is_some() || tokio::time::Instant::now() >= deadline {
                        return false;
                    }
                }
            }
        }
    }
}

/// A member's staging caches, per tenant namespace.
pub struct StagingWatches {
    client: Client,
    namespaces: tokio::sync::Mutex<HashMap<String, Arc<StagingNs>>>,
}

impl StagingWatches {
    /// None yet; `client` is the member's watch client.
    pub fn new(client: Client) -> Self {
        Self { client, namespaces: Default::default() }
    }

    /// The namespace's staging caches when the ModelCache reconciler already started them and
    /// they are synced within `wait` with no watch failing; never starts any (the sweep asks).
    pub async fn if_started(&self, ns: &str, wait: Duration) -> Option<Arc<StagingNs>> {
        let cache = self.namespaces.lock().await.get(ns).cloned()?;
        (cache.ready(wait).await && cache.failed().is_none()).then_some(cache)
    }

    /// The namespace's staging caches, started if needed, when they are synced within `wait`
    /// and no watch of them is failing; `None`: read the member instead.
    pub async fn synced(&self, ns: &str, wait: Duration) -> Option<Arc<StagingNs>> {
        let cache = {
            let mut namespaces = self.namespaces.lock().await;
            let retry = namespaces
                .get(ns)
                .is_some_and(|c| matches!(c.failed(), Some((true, _))) && c.started.elapsed() >= RETRY);
            if retry {
                namespaces.remove(ns);
            }
            namespaces.entry(ns.to_string()).or_insert_with(|| Arc::new(StagingNs::start(&self.client, ns))).clone()
        };
        if cache.ready(wait).await {
            Some(cache)
        } else {
            if let Some((refused, what)) = cache.failed() {
                tracing::debug!(refused, "member staging cache not used: {what}");
            }
            None
        }
    }
}
