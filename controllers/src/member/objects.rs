//! A member's caches of Flotilla's own workloads: Deployments, Services, PodDisruptionBudgets
//! and — where the member serves them — LeaderWorkerSets and DRA ResourceClaimTemplates carrying Flotilla's managed-by
//! label. One reflector per kind **per namespace**, started the first time a reconcile looks
//! at that namespace of that member and kept for the member client's life: the least a member
//! must grant is a Role in each tenant namespace (`examples/member-rbac`), so nothing here
//! lists or watches cluster-wide. Which optional kinds exist is asked once per member from
//! discovery (a GET, not a LIST), and again after Flotilla wrote a kind it had found missing.
//! A watch the member refuses (HTTP 403) stops at once and says so; it is tried again on a later
//! look, after [`RETRY`]. Stored objects are stripped (`strip::workload`). What Flotilla
//! wrote and the cache does not show yet is remembered in the member's `memo`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_apis::constants::labels;
use futures_util::StreamExt;
use kube::api::DynamicObject;
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use super::memo::{Key, Memo, Seen, Wrote};
use super::{AbortOnDrop, MemberError, WATCH_TIMEOUT_SECS};

/// After a refused or failed start, a namespace's caches are started again no sooner than this.
pub const RETRY: Duration = Duration::from_secs(60);

/// The kinds cached: (group, version, kind, always served).
pub const KINDS: [(&str, &str, &str, bool); 6] = [
    ("apps", "v1", "Deployment", true),
    ("", "v1", "Service", true),
    ("policy", "v1", "PodDisruptionBudget", true),
    ("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", false),
    ("resource.k8s.io", "v1", "ResourceClaimTemplate", false),
    ("gateway.networking.k8s.io", "v1", "HTTPRoute", false),
];

/// The `ApiResource` of `KINDS[i]`.
pub fn resource(i: usize) -> ApiResource {
    let (g, v, k, _) = KINDS[i];
    ApiResource::from_gvk(&GroupVersionKind::gvk(g, v, k))
}

/// The index of a kind in `KINDS`.
pub fn kind_index(kind: &str) -> Option<usize> {
    KINDS.iter().position(|k| k.2 == kind)
}

/// One cached object as a reconcile should read it.
#[derive(Clone, Debug)]
pub struct Cached {
    /// `KINDS[kind].2`.
    pub kind: &'static str,
    /// Its name.
    pub name: String,
    /// The object as cached (`None`: written by Flotilla, not in the cache yet).
    pub object: Option<Arc<DynamicObject>>,
    /// Written by Flotilla with this hash, and the cache does not show it yet.
    pub pending: Option<String>,
}

struct NsCache {
    stores: Vec<(usize, Store<DynamicObject>)>,
    /// Per kind (`KINDS` index) whose watch failed since it last showed it is live: (refused,
    /// what). Cleared by the watch's next event, or by a LIST of the kind that the member
    /// answers ([`NsCache::ready`]): a resumed watch says nothing until something changes.
    failure: Arc<Mutex<std::collections::BTreeMap<usize, (bool, String)>>>,
    /// The member's client and the namespace, for that LIST.
    client: Client,
    ns: String,
    started: Instant,
    _tasks: Vec<AbortOnDrop>,
}

impl NsCache {
    fn start(client: &Client, ns: &str, kinds: &[usize]) -> Self {
        let failure: Arc<Mutex<std::collections::BTreeMap<usize, (bool, String)>>> = Arc::default();
        let mut stores = Vec::new();
        let mut tasks = Vec::new();
        for &i in kinds {
            let ar = resource(i);
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
            let config = watcher::Config::default()
                .labels(&format!("{}=flotilla", labels::MANAGED_BY))
                .timeout(WATCH_TIMEOUT_SECS);
            let writer = reflector::store::Writer::new(ar);
            stores.push((i, writer.as_reader()));
            let f = failure.clone();
            let (kind, ns) = (KINDS[i].2, ns.to_string());
            tasks.push(AbortOnDrop(tokio::spawn(async move {
                let mut events = std::pin::pin!(
                    watcher(api, config).default_backoff().modify(super::strip::workload).reflect(writer)
                );
                while let Some(event) = events.next().await {
                    let e = match event {
                        Ok(_) => {
                            // Live again (or still): what the store holds is current.
                            if let Ok(mut slot) = f.lock()
                                && !slot.is_empty()
                            {
                                slot.remove(&i);
                            }
                            continue;
                        }
                        Err(e) => e,
                    };
                    let refused = matches!(&e,
                        watcher::Error::InitialListFailed(kube::Error::Api(s))
                        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 403);
                    let text = format!("{kind} in namespace {ns}: {}", super::watch_error(&e));
                    tracing::debug!("member cache: {text}");
                    if let Ok(mut slot) = f.lock() {
                        slot.insert(i, (refused, text));
                    }
                    if refused {
                        return;
                    }
                }
            })));
        }
        Self { stores, failure, client: client.clone(), ns: ns.to_string(), started: Instant::now(), _tasks: tasks }
    }

    /// LIST each kind whose watch failed (not refused): an answer clears its failure.
    async fn recheck(&self, wait: Duration) {
        let failing: Vec<usize> = match self.failure.lock() {
            Ok(f) => f.iter().filter(|(_, (refused, _))| !refused).map(|(i, _)| *i).collect(),
            Err(_) => return,
        };
        for i in failing {
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &resource(i));
            let lp = kube::api::ListParams::default().labels(&format!("{}=flotilla", labels::MANAGED_BY)).limit(1);
            if let Ok(Ok(_)) = tokio::time::timeout(wait, api.list(&lp)).await
                && let Ok(mut f) = self.failure.lock()
            {
                f.remove(&i);
            }
        }
    }

    /// A watch failing now: (refused, what); a refused one first.
    fn failed(&self) -> Option<(bool, String)> {
        let f = self.failure.lock().ok()?;
        f.values().find(|(refused, _)| *refused).or_else(|| f.values().next()).cloned()
    }

    /// Synced, and the member answering: a store whose watch failed (the member stopped
    /// answering) still holds what it last saw, which is not evidence of what runs now. A kind
    /// whose watch failed is listed (one object, bounded by `wait`); the member's answer clears
    /// the failure (the watch resumes from where it was and replays what it missed), no answer
    /// makes the member unreachable for this look.
    async fn ready(&self, wait: Duration) -> Result<(), MemberError> {
        let all = futures_util::future::join_all(self.stores.iter().map(|(_, s)| s.wait_until_ready()));
        let synced = matches!(tokio::time::timeout(wait, all).await, Ok(r) if r.iter().all(Result::is_ok));
        if synced {
            self.recheck(wait).await;
        }
        match synced {
            true if self.failed().is_none() => Ok(()),
            _ => Err(match self.failed() {
                Some((true, why)) => MemberError::Unauthorized(format!(
                    "the member refused to let the controller watch {why}: grant list and watch there \
                     (examples/member-rbac)"
                )),
                Some((false, why)) => MemberError::Unreachable(format!("the member's watch of {why}")),
                None => MemberError::Unreachable(format!(
                    "the member's watches of Flotilla's objects did not sync within {} s",
                    wait.as_secs()
                )),
            }),
        }
    }
}

/// Which optional kinds the member serves, as discovery said.
#[derive(Clone, Debug, Default)]
struct Served {
    kinds: Vec<usize>,
    /// A kind Flotilla wrote was missing from `kinds`: ask discovery again.
    stale: bool,
}

/// Flotilla's objects in one member, per namespace, and the memo of its writes.
pub struct MemberObjects {
    client: Client,
    namespaces: tokio::sync::Mutex<HashMap<String, Arc<NsCache>>>,
    served: Mutex<Option<Served>>,
    memo: Mutex<Memo>,
    /// Whether a sweep has listed this member once (objects from before this controller started).
    pub(crate) swept_once: std::sync::atomic::AtomicBool,
    /// Where the sweep's namespace LISTs stopped (`sweep::list`'s budget).
    pub(crate) sweep_cursor: std::sync::atomic::AtomicUsize,
    /// What the sweep's passes of an unfinished round listed.
    pub(crate) sweep_partial: Mutex<Vec<crate::sweep::Found>>,
    /// Whether objects of the ModelCache kinds (Jobs, volume claims, Secrets) may be here: true
    /// until a sweep lists them and finds none, and again whenever the ModelCache reconciler
    /// comes here ([`MemberObjects::cache_kinds_touched`]).
    pub(crate) cache_kinds: std::sync::atomic::AtomicBool,
    /// Namespaces Flotilla applied here (or was refused), so that a workload write does not
    /// apply its namespace again; forgotten when a write there fails.
    namespaces_applied: Mutex<HashSet<String>>,
    /// The ModelCache staging objects here, from watches (`staging.rs`).
    pub staging: super::staging::StagingWatches,
}

impl MemberObjects {
    /// Whether namespace `ns` was applied here since this member's client was built.
    pub fn namespace_applied(&self, ns: &str) -> bool {
        self.namespaces_applied.lock().is_ok_and(|n| n.contains(ns))
    }

    /// Records that namespace `ns` was applied here, or refused (a member that grants the
    /// controller only Roles in tenant namespaces): a later write that fails forgets it.
    pub fn mark_namespace(&self, ns: &str) {
        if let Ok(mut n) = self.namespaces_applied.lock() {
            n.insert(ns.to_string());
        }
    }

    /// Forgets namespace `ns`: a write there failed (it may have been deleted), so the next
    /// write applies it again.
    pub fn forget_namespace(&self, ns: &str) {
        if let Ok(mut n) = self.namespaces_applied.lock() {
            n.remove(ns);
        }
    }

    /// No caches yet; `client` is the member's watch client.
    pub fn new(client: Client) -> Self {
        Self {
            staging: super::staging::StagingWatches::new(client.clone()),
            client,
            namespaces: Default::default(),
            served: Mutex::default(),
            memo: Mutex::default(),
            namespaces_applied: Mutex::default(),
            swept_once: Default::default(),
            sweep_cursor: Default::default(),
            sweep_partial: Mutex::default(),
            cache_kinds: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// The ModelCache reconciler is about to read or write its kinds here: the sweep lists
    /// them again on its next pass.
    pub fn cache_kinds_touched(&self) {
        self.cache_kinds.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    async fn served(&self, wait: Duration) -> Result<Vec<usize>, MemberError> {
        if let Ok(s) = self.served.lock()
            && let Some(s) = s.as_ref()
            && !s.stale
        {
            return Ok(s.kinds.clone());
        }
        let mut kinds = Vec::new();
        for (i, (g, v, k, always)) in KINDS.iter().enumerate() {
            if *always {
                kinds.push(i);
                continue;
            }
            let group_version = format!("{g}/{v}");
            match tokio::time::timeout(wait, self.client.list_api_group_resources(&group_version)).await {
                Ok(Ok(list)) if list.resources.iter().any(|r| r.kind == *k && !r.name.contains('/')) => kinds.push(i),
                Ok(Ok(_)) => {}
                Ok(Err(kube::Error::Api(s))) if s.code == 404 => {}
                Ok(Err(e)) => return Err(super::classify(&e)),
                Err(_) => return Err(MemberError::Unreachable("the member's discovery did not answer in time".into())),
            }
        }
        if let Ok(mut s) = self.served.lock() {
            *s = Some(Served { kinds: kinds.clone(), stale: false });
        }
        Ok(kinds)
    }

    /// The namespace's caches, started if needed and synced (waiting at most `wait`).
    async fn namespace(&self, ns: &str, wait: Duration) -> Result<Arc<NsCache>, MemberError> {
        let stale = self.served.lock().map(|s| s.as_ref().is_some_and(|s| s.stale)).unwrap_or(false);
        let kinds = self.served(wait).await?;
        let cache = {
            let mut namespaces = self.namespaces.lock().await;
            if stale {
                // Kinds may have appeared: every namespace starts again with them.
                namespaces.retain(|_, c| c.stores.iter().map(|s| s.0).collect::<Vec<_>>() == kinds);
            }
            // A refused watch stopped; any other failure the watcher retries by itself.
            let retry = namespaces
                .get(ns)
                .is_some_and(|c| matches!(c.failed(), Some((true, _))) && c.started.elapsed() >= RETRY);
            if retry {
                namespaces.remove(ns);
            }
            namespaces
                .entry(ns.to_string())
                .or_insert_with(|| Arc::new(NsCache::start(&self.client, ns, &kinds)))
                .clone()
        };
        cache.ready(wait).await?;
        Ok(cache)
    }

    /// Whether `ns` has caches (started by an earlier look).
    pub async fn has(&self, ns: &str) -> bool {
        self.namespaces.lock().await.contains_key(ns)
    }

    /// The namespaces with caches.
    pub async fn namespaces(&self) -> BTreeSet<String> {
        self.namespaces.lock().await.keys().cloned().collect()
    }

    /// Flotilla's objects in `ns` whose label `owner_label` is `owner` (a ModelDeployment's
    /// `<namespace>.<name>`) and that installation `install` wrote (or a release before install
    /// labels: `deployment::members::ours_or_legacy`), as the caches and the memo say to read
    /// them: written but not yet cached ones with their hash, deleted but still cached ones
    /// left out. Another installation's objects are never returned.
    pub async fn owned(
        &self,
        ns: &str,
        owner_label: &str,
        owner: &str,
        install: &str,
        wait: Duration,
    ) -> Result<Vec<Cached>, MemberError> {
        let cache = self.namespace(ns, wait).await?;
        let now = Instant::now();
        let Ok(mut memo) = self.memo.lock() else {
            return Err(MemberError::Unreachable("internal lock poisoned".into()));
        };
        let mut out = Vec::new();
        let mut seen: BTreeSet<Key> = BTreeSet::new();
        for (i, store) in &cache.stores {
            let kind = KINDS[*i].2;
            for o in store.state() {
                if o.metadata.labels.as_ref().and_then(|l| l.get(owner_label)).map(String::as_str) != Some(owner)
                    || !crate::deployment::members::ours_or_legacy(&o.metadata, install)
                {
                    continue;
                }
                let name = o.metadata.name.clone().unwrap_or_default();
                let key: Key = (kind, ns.to_string(), name.clone());
                let judged = memo.judge(&key, o.metadata.resource_version.as_deref(), now);
                seen.insert(key);
                match judged {
                    Seen::Cache => out.push(Cached { kind, name, object: Some(o), pending: None }),
                    Seen::Pending(h) => out.push(Cached { kind, name, object: Some(o), pending: Some(h) }),
                    Seen::Gone => {}
                }
            }
        }
        // Written by Flotilla and not in the cache yet.
        for key in memo.applied_by(ns, owner) {
            if seen.contains(&key) {
                continue;
            }
            if let Seen::Pending(h) = memo.judge(&key, None, now) {
                out.push(Cached { kind: key.0, name: key.2, object: None, pending: Some(h) });
            }
        }
        Ok(out)
    }

    /// Every cached object in every cached namespace (for the sweep): kind index, object.
    pub async fn all(&self, wait: Duration) -> Vec<(usize, Arc<DynamicObject>)> {
        let caches: Vec<Arc<NsCache>> = self.namespaces.lock().await.values().cloned().collect();
        let mut out = Vec::new();
        for c in caches {
            if c.ready(wait).await.is_err() {
                continue;
            }
            for (i, store) in &c.stores {
                out.extend(store.state().into_iter().map(|o| (*i, o)));
            }
        }
        out
    }

    /// Remembers that Flotilla applied `kind/name` in `ns` (hash, answered `resourceVersion`).
    pub fn applied(&self, kind: &str, ns: &str, name: &str, owner: &str, hash: &str, resource_version: &str) {
        let Some(i) = kind_index(kind) else { return };
        let wrote = Wrote::Applied { hash: hash.into(), resource_version: resource_version.into() };
        if let Ok(mut m) = self.memo.lock() {
            m.wrote((KINDS[i].2, ns.into(), name.into()), owner, wrote, Instant::now());
        }
        if let Ok(mut s) = self.served.lock()
            && let Some(s) = s.as_mut()
            && !s.kinds.contains(&i)
        {
            s.stale = true;
        }
    }

    /// Remembers that Flotilla deleted `kind/name` in `ns`.
    pub fn deleted(&self, kind: &str, ns: &str, name: &str, owner: &str) {
        let Some(i) = kind_index(kind) else { return };
        if let Ok(mut m) = self.memo.lock() {
            m.wrote((KINDS[i].2, ns.into(), name.into()), owner, Wrote::Deleted, Instant::now());
        }
    }
}
