//! Removing what Flotilla left in a member. Observe: the member's objects carrying Flotilla's
//! labels (`app.kubernetes.io/managed-by=flotilla` plus `flotilla.dev/deployment` or
//! `flotilla.dev/cache`) and this installation's `flotilla.dev/install` — another control
//! plane's objects, and objects of a release before install labels (until their deployment's
//! next apply labels them), are never touched. Deployments, Services, PodDisruptionBudgets, LeaderWorkerSets and
//! ResourceClaimTemplates come from the member's caches (`member/objects.rs`: every namespace the controller applied
//! to since it started); the first pass that reaches a member also lists them once —
//! across the cluster where the member lets the controller, else in the namespaces of the
//! control cluster's tenant objects — for what was left before the controller started. The
//! ModelCache kinds (Jobs, volume claims, Secrets) are not cached: a pass lists them only where
//! some may be ([`kinds_to_list`]: the last listing there found some, or the ModelCache
//! reconciler has been there since), so a fleet without caches sends its members no LIST.
//! Decide ([`orphans`], pure): those whose owner (`<namespace>.<name>`) no ModelDeployment or
//! ModelCache is any more, older than a grace period, at most a bounded number per pass; and
//! ([`gate`], pure) whether that is more than a bounded share of the member's objects of this
//! installation — a control cluster restored from an old backup, or pointed at the wrong
//! member, sees most of them as orphans: then the pass deletes nothing, raises a `SweepHeld`
//! Warning event on the InferenceCluster and counts `member_sweeps_total{outcome="Held"}`
//! until an operator approves (the annotation `flotilla.dev/approve-sweep=<count>`).
//! Apply: delete them. Objects without Flotilla's labels are never listed, so never touched.
//! The periodic sweep runs members concurrently (at most [`MEMBERS_AT_ONCE`]), each bounded by
//! a timeout, so one unreachable member stalls no other; where a member refuses cluster-wide
//! LISTs, a pass makes at most [`MAX_NAMESPACE_LISTS`] namespace LISTs there and the next pass
//! continues where it stopped (the first pass is done once they covered every namespace); an InferenceCluster deleted with `deletionPolicy:
//! Cleanup` is swept with no owner at all, limited to the objects written through it
//! (`flotilla.dev/cluster`), without the share bound (the deletion asked for all of them).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use flotilla_apis::constants::{annotations, event, labels};
use flotilla_apis::{InferenceCluster, ModelCache, ModelDeployment};
use futures_util::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use kube::api::{DeleteParams, ListParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use crate::member::{Handle, MemberClients, Timeouts, brief};
use crate::metrics::{Metrics, SweepOutcome};

/// Objects younger than this are never swept: their owner may not have reached the reflector
/// the sweep reads yet.
pub const GRACE: Duration = Duration::from_secs(60);
/// At most this many deletions per member per pass; the next pass continues.
pub const MAX_DELETES: usize = 200;
/// A pass may always delete this many objects, whatever their share of the member's.
pub const ALWAYS: usize = 10;
/// At most this many namespace LISTs per member per periodic pass, where the member refuses
/// cluster-wide ones (namespaced RBAC): the next pass continues where this one stopped.
pub const MAX_NAMESPACE_LISTS: usize = 32;
/// How long a pass waits for a tenant namespace's staging watches to show they are synced.
const STAGED_WAIT: Duration = Duration::from_millis(100);
/// At most this many members swept at the same time.
pub const MEMBERS_AT_ONCE: usize = 16;

/// The member kinds Flotilla creates, with the label naming their owner. The first six are
/// the ModelDeployment kinds the member caches hold.
const KINDS: [(&str, &str, &str, &str); 9] = [
    ("apps", "v1", "Deployment", labels::DEPLOYMENT),
    ("", "v1", "Service", labels::DEPLOYMENT),
    ("policy", "v1", "PodDisruptionBudget", labels::DEPLOYMENT),
    ("resource.k8s.io", "v1", "ResourceClaimTemplate", labels::DEPLOYMENT),
    ("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", labels::DEPLOYMENT),
    ("gateway.networking.k8s.io", "v1", "HTTPRoute", labels::DEPLOYMENT),
    ("batch", "v1", "Job", labels::CACHE),
    ("", "v1", "PersistentVolumeClaim", labels::CACHE),
    ("", "v1", "Secret", labels::CACHE),
];

/// One labelled object found in a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Index into the kinds Flotilla creates.
    pub kind: usize,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The owner label's value (`<namespace>.<name>`).
    pub owner: String,
    /// The InferenceCluster it was written through (`flotilla.dev/cluster`), if labelled.
    pub cluster: Option<String>,
    /// Seconds since it was created.
    pub age: Duration,
    /// Whether it is already being deleted.
    pub deleting: bool,
}

/// `<namespace>.<name>` of the owners that exist, per label.
#[derive(Clone, Debug, Default)]
pub struct Owners {
    /// ModelDeployments.
    pub deployments: BTreeSet<String>,
    /// ModelCaches.
    pub caches: BTreeSet<String>,
}

impl Owners {
    /// The owners in the control cluster's reflectors (objects being deleted still own theirs:
    /// their finalizer decides).
    pub fn from_stores(deployments: &Store<ModelDeployment>, caches: &Store<ModelCache>) -> Self {
        // The owner label's value as the objects carry it (shortened with a hash past 63
        // characters, as `render::deployment_key` and `cache::render::cache_key` write it).
        let key = |ns: Option<String>, name: String| flotilla_apis::names::owner_key(&ns.unwrap_or_default(), &name);
        Self {
            deployments: deployments.state().iter().map(|d| key(d.namespace(), d.name_any())).collect(),
            caches: caches.state().iter().map(|c| key(c.namespace(), c.name_any())).collect(),
        }
    }

    fn owns(&self, label: &str, owner: &str) -> bool {
        if label == labels::CACHE { self.caches.contains(owner) } else { self.deployments.contains(owner) }
    }

    /// The namespaces tenant objects are in (where a member without cluster-wide list rights
    /// is looked at).
    pub fn namespaces(&self) -> BTreeSet<String> {
        self.deployments
            .iter()
            .chain(&self.caches)
            .filter_map(|k| k.split_once('.').map(|(ns, _)| ns.to_string()))
            .collect()
    }
}

/// The objects to delete: those whose owner does not exist, older than `grace`, not already
/// being deleted, written through `cluster` when one is given, at most `max`, in a stable
/// order.
pub fn orphans(found: &[Found], owners: &Owners, grace: Duration, cluster: Option<&str>, max: usize) -> Vec<Found> {
    let mut out: Vec<Found> = found
        .iter()
        .filter(|f| cluster.is_none_or(|c| f.cluster.as_deref() == Some(c)))
        .filter(|f| !f.deleting && f.age >= grace && !owners.owns(KINDS[f.kind].3, &f.owner))
        .cloned()
        .collect();
    out.sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
    out.truncate(max);
    out
}

/// Whether a pass may delete `doomed` of the `total` objects of this installation it found in
/// a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Within the bound (or no bound): delete.
    Proceed,
    /// Past the bound, but an operator approved at least this many: delete.
    Approved,
    /// Past the bound: delete nothing, say so, wait for an operator.
    Held,
}

/// More than `max_share` percent of `total`, and more than [`ALWAYS`], is held unless
/// `approved` (the InferenceCluster's `flotilla.dev/approve-sweep`) is at least `doomed`.
/// `max_share` of `None`: no bound (an InferenceCluster's deletion).
pub fn gate(doomed: usize, total: usize, max_share: Option<u32>, approved: Option<usize>) -> Gate {
    let Some(share) = max_share else { return Gate::Proceed };
    let bound = total.saturating_mul(share as usize) / 100;
    if doomed <= ALWAYS || doomed <= bound {
        Gate::Proceed
    } else if approved.is_some_and(|a| a >= doomed) {
        Gate::Approved
    } else {
        Gate::Held
    }
}

/// The count an InferenceCluster's `flotilla.dev/approve-sweep` annotation approves.
pub fn approved(ic: &InferenceCluster) -> Option<usize> {
    ic.metadata.annotations.as_ref()?.get(annotations::APPROVE_SWEEP)?.trim().parse().ok()
}

/// What one pass over a member is told.
#[derive(Clone, Debug)]
pub struct Scope<'a> {
    /// `<namespace>.<name>` of the owners that exist.
    pub owners: &'a Owners,
    /// Where to look when the member refuses a cluster-wide list.
    pub namespaces: &'a BTreeSet<String>,
    /// This installation's `flotilla.dev/install`.
    pub install: &'a str,
    /// Younger objects are left.
    pub grace: Duration,
    /// Only objects written through this InferenceCluster (its deletion).
    pub cluster: Option<&'a str>,
    /// The share bound ([`gate`]); `None`: none.
    pub max_share: Option<u32>,
    /// What the InferenceCluster's annotation approves.
    pub approved: Option<usize>,
    /// List every kind, fresh (an InferenceCluster's deletion), instead of reading the caches.
    pub list_all: bool,
}

/// What one pass over a member did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Objects of this installation found (in the cluster's scope, when given), before deleting.
    pub found: usize,
    /// Of those, orphaned (all of them, before the per-pass bound).
    pub orphaned: usize,
    /// Deleted.
    pub deleted: usize,
    /// Whether the share bound held the pass (nothing deleted).
    pub held: bool,
    /// Whether the pass went past the share bound by an operator's approval.
    pub approved: bool,
    /// Whether the pass's LISTs were cut by the budget: it decided nothing (the next ones
    /// continue the round; the one that completes it decides).
    pub partial: bool,
}

fn api(client: &Client, kind: usize, ns: Option<&str>) -> Api<DynamicObject> {
    let (g, v, k, _) = KINDS[kind];
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(g, v, k));
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// How many of `KINDS` the member caches hold.
const CACHED_KINDS: usize = 6;

fn found(kind: usize, o: &ObjectMeta, now: Timestamp, install: &str) -> Option<Found> {
    let l = o.labels.as_ref()?;
    let owner = l.get(KINDS[kind].3)?.clone();
    let managed = l.get(labels::MANAGED_BY).is_some_and(|v| v == "flotilla");
    if !managed || l.get(labels::INSTALL).map(String::as_str) != Some(install) {
        return None;
    }
    let created = o.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let age = Duration::from_secs(now.as_second().saturating_sub(created.as_second()).max(0) as u64);
    Some(Found {
        kind,
        namespace: o.namespace.clone().unwrap_or_default(),
        name: o.name.clone().unwrap_or_default(),
        owner,
        cluster: l.get(labels::CLUSTER).cloned(),
        age,
        deleting: o.deletion_timestamp.is_some(),
    })
}

/// The part of `len` namespace LISTs one pass makes, from `cursor` (where the last pass
/// stopped) and at most `max` of them (`None`: all): the range, and whether it reaches the end
/// (the next pass starts again from the first).
pub fn window(len: usize, cursor: usize, max: Option<usize>) -> (std::ops::Range<usize>, bool) {
    let start = if cursor < len { cursor } else { 0 };
    let end = max.map_or(len, |m| (start + m).min(len));
    (start..end, end == len)
}

/// What [`list`] found, and whether it covered every namespace LIST it had to make.
pub struct Listed {
    /// Objects of this installation.
    pub found: Vec<Found>,
    /// False when the namespace LISTs were cut by the budget (the rest come next pass).
    pub complete: bool,
}

/// Lists this installation's labelled objects of `KINDS[kinds]` in a member: cluster-wide, or
/// — where the member refuses that (namespaced RBAC) — in each of `namespaces`, at most
/// `budget.1` namespace LISTs per call, continuing from the cursor `budget.0` (`None`: every
/// one, as an InferenceCluster's deletion needs). A kind the member lacks or does not let the
/// controller see is skipped.
pub async fn list(
    client: &Client,
    namespaces: &BTreeSet<String>,
    kinds: std::ops::Range<usize>,
    install: &str,
    budget: Option<(&std::sync::atomic::AtomicUsize, usize)>,
) -> Result<Listed, kube::Error> {
    use std::sync::atomic::Ordering;
    let now = Timestamp::now();
    let selector = |label: &str| {
        ListParams::default().labels(&format!("{label},{}=flotilla,{}={install}", labels::MANAGED_BY, labels::INSTALL))
    };
    let mut out = Vec::new();
    let mut by_namespace: Vec<(usize, &String)> = Vec::new();
    for (i, (_, _, _, label)) in KINDS.iter().enumerate().filter(|(i, _)| kinds.contains(i)) {
        match api(client, i, None).list_metadata(&selector(label)).await {
            Ok(l) => out.extend(l.items.iter().filter_map(|o| found(i, &o.metadata, now, install))),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(kube::Error::Api(s)) if s.code == 403 => by_namespace.extend(namespaces.iter().map(|ns| (i, ns))),
            Err(e) => return Err(e),
        }
    }
    let cursor = budget.map_or(0, |(c, _)| c.load(Ordering::Relaxed));
    let (range, complete) = window(by_namespace.len(), cursor, budget.map(|b| b.1));
    for &(i, ns) in &by_namespace[range.clone()] {
        match api(client, i, Some(ns)).list_metadata(&selector(KINDS[i].3)).await {
            Ok(l) => out.extend(l.items.iter().filter_map(|o| found(i, &o.metadata, now, install))),
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => {
                tracing::debug!(kind = KINDS[i].2, namespace = %ns, code = s.code, "sweep: not listable there");
            }
            Err(e) => return Err(e),
        }
    }
    if let Some((c, _)) = budget {
        c.store(if complete { 0 } else { range.end }, Ordering::Relaxed);
    }
    Ok(Listed { found: out, complete })
}

/// Deletes what [`orphans`] chose. Returns how many were deleted.
pub async fn delete(client: &Client, doomed: &[Found]) -> Result<usize, kube::Error> {
    let mut n = 0;
    for f in doomed {
        match api(client, f.kind, Some(&f.namespace)).delete(&f.name, &DeleteParams::background()).await {
            Ok(_) => n += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// What the member's staging watches hold of the ModelCache kinds (Jobs, volume claims,
/// Secrets) in every one of `namespaces`, as `Found`s; `None` when a namespace has none started
/// by the ModelCache reconciler, or one not synced or failing (then the pass lists). The watches
/// answer at once or not at all: the pass does not wait on them (its member timeout is for the
/// LISTs that follow).
async fn staged(member: &Handle, namespaces: &BTreeSet<String>, install: &str) -> Option<Vec<Found>> {
    let now = Timestamp::now();
    let kind = |k: &str| KINDS.iter().position(|x| x.2 == k);
    let (job, pvc, secret) = (kind("Job")?, kind("PersistentVolumeClaim")?, kind("Secret")?);
    let mut out = Vec::new();
    for ns in namespaces {
        let st = member.objects.staging.if_started(ns, STAGED_WAIT).await?;
        out.extend(st.jobs.state().iter().filter_map(|o| found(job, &o.metadata, now, install)));
        out.extend(st.pvcs.state().iter().filter_map(|o| found(pvc, &o.metadata, now, install)));
        out.extend(st.secrets.state().iter().filter_map(|o| found(secret, &o.metadata, now, install)));
    }
    Some(out)
}

/// What a member's caches hold of the ModelDeployment kinds, as `Found`s.
async fn cached(member: &Handle, t: Timeouts, install: &str) -> Vec<Found> {
    let now = Timestamp::now();
    member
        .objects
        .all(t.observe)
        .await
        .into_iter()
        .filter_map(|(i, o)| {
            let kind = KINDS.iter().position(|k| k.2 == crate::member::objects::KINDS[i].2)?;
            found(kind, &o.metadata, now, install)
        })
        .collect()
}

/// Which of `KINDS` a pass lists in a member: every kind on its first pass there (or when asked
/// to, as an InferenceCluster's deletion does); after that only the ModelCache kinds, and only
/// where some may be (`cache_kinds_possible`: the last listing found some, or the ModelCache
/// reconciler has been to the member since); else nothing — the caches hold the rest.
pub fn kinds_to_list(first: bool, cache_kinds_possible: bool) -> std::ops::Range<usize> {
    if first {
        0..KINDS.len()
    } else if cache_kinds_possible {
        CACHED_KINDS..KINDS.len()
    } else {
        KINDS.len()..KINDS.len()
    }
}

/// One pass over one member: observe (caches, and lists as the module header says; every kind,
/// fresh, when `scope.list_all`, as an InferenceCluster's deletion does), decide, delete;
/// bounded by the member timeout (twice: the reads and the deletions).
pub async fn member(member: &Handle, scope: &Scope<'_>, t: Timeouts) -> Result<Swept, String> {
    use std::sync::atomic::Ordering;
    let first = scope.list_all || !member.objects.swept_once.load(Ordering::Relaxed);
    // Taken for this pass; set again below when the listing finds some, or by the ModelCache
    // reconciler meanwhile (so a write during the pass is not lost), or when the pass fails.
    let possible = member.objects.cache_kinds.swap(false, Ordering::SeqCst);
    let pass = async {
        let mut found = if scope.list_all { Vec::new() } else { cached(member, t, scope.install).await };
        // After the first pass, the ModelCache kinds come from the staging watches the ModelCache
        // reconciler keeps where every namespace has them (synced, none failing): no LIST then.
        let mut kinds = kinds_to_list(first, possible);
        if !first
            && !scope.list_all
            && !kinds.is_empty()
            && let Some(staged) = staged(member, scope.namespaces, scope.install).await
        {
            found.extend(staged);
            kinds = KINDS.len()..KINDS.len();
            // Still possible: the next pass looks again (at the watches).
            member.objects.cache_kinds.store(true, Ordering::SeqCst);
        }
        // A periodic pass makes a bounded number of namespace LISTs; a deletion makes them all.
        let budget = (!scope.list_all).then_some((&member.objects.sweep_cursor, MAX_NAMESPACE_LISTS));
        let listed = list(&member.client, scope.namespaces, kinds, scope.install, budget).await?;
        if listed.found.iter().any(|f| f.kind >= CACHED_KINDS) || (possible && !listed.complete) {
            member.objects.cache_kinds.store(true, Ordering::SeqCst);
        }
        // A pass cut by the budget is not a whole view of the member: what it listed waits for
        // the pass that completes the round, and nothing is decided on a part (the share bound
        // must see every object of this installation).
        let complete = listed.complete;
        let more = {
            let Ok(mut partial) = member.objects.sweep_partial.lock() else {
                return Ok(Swept { partial: true, ..Swept::default() });
            };
            partial.extend(listed.found);
            if !complete {
                return Ok(Swept { partial: true, ..Swept::default() });
            }
            std::mem::take(&mut *partial)
        };
        // What the first pass lists may also be cached: once each.
        for f in more {
            if !found.iter().any(|g| g.kind == f.kind && g.namespace == f.namespace && g.name == f.name) {
                found.push(f);
            }
        }
        let in_scope = found.iter().filter(|f| scope.cluster.is_none_or(|c| f.cluster.as_deref() == Some(c))).count();
        let doomed = orphans(&found, scope.owners, scope.grace, scope.cluster, usize::MAX);
        let mut swept = Swept { found: in_scope, orphaned: doomed.len(), ..Swept::default() };
        match gate(doomed.len(), found.len(), scope.max_share, scope.approved) {
            Gate::Held => swept.held = true,
            g => {
                swept.approved = g == Gate::Approved;
                swept.deleted = delete(&member.client, &doomed[..doomed.len().min(MAX_DELETES)]).await?;
            }
        }
        // The first pass is done once its LISTs covered every namespace, over as many passes
        // as the budget takes.
        if complete {
            member.objects.swept_once.store(true, Ordering::Relaxed);
        }
        Ok::<Swept, kube::Error>(swept)
    };
    let outcome = match tokio::time::timeout(t.observe * 2, pass).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(brief(&e)),
        Err(_) => Err("did not answer in time".into()),
    };
    if outcome.is_err() && possible {
        member.objects.cache_kinds.store(true, Ordering::SeqCst);
    }
    outcome
}

/// Everything a periodic sweep reads.
pub struct SweepContext {
    /// The control cluster.
    pub client: Client,
    /// Member clusters.
    pub clusters: Store<InferenceCluster>,
    /// ModelDeployments.
    pub deployments: Store<ModelDeployment>,
    /// ModelCaches.
    pub caches: Store<ModelCache>,
    /// Member clients.
    pub members: Arc<MemberClients>,
    /// Member call timeouts.
    pub timeouts: Timeouts,
    /// This installation's `flotilla.dev/install`.
    pub install: String,
    /// The share bound, in percent ([`gate`]).
    pub max_share: u32,
    /// Younger objects are left.
    pub grace: Duration,
    /// Counts passes by outcome.
    pub metrics: Metrics,
    /// Raises `SweepHeld` on InferenceClusters.
    pub recorder: Recorder,
}

/// The `SweepHeld` event of a held pass. Its action carries the count: kube's recorder folds
/// events with the same reason and action on the same object into one series and keeps the
/// first one's note, so a series must not outlive its count — the operator approves the number
/// the note says, and a stale one (a pass that saw part of a burst of orphans, then all of it)
/// would never be enough.
fn held_event(s: &Swept, max_share: u32) -> Event {
    let note = format!(
        "the sweep would delete {} of the {} objects of this Flotilla installation in the member (more than {}%): \
         nothing deleted. If their ModelDeployments and ModelCaches were really deleted, approve with the annotation \
         {}={} on this InferenceCluster (remove it after the sweep); if not (a control cluster restored from an older \
         backup, or pointed at the wrong member), fix the control cluster",
        s.orphaned,
        s.found,
        max_share,
        annotations::APPROVE_SWEEP,
        s.orphaned
    );
    Event {
        type_: EventType::Warning,
        reason: event::SWEEP_HELD.into(),
        note: Some(note),
        action: format!("HoldSweepOf{}", s.orphaned),
        secondary: None,
    }
}

/// Says that a pass over `ic`'s member was held: a Warning event on the InferenceCluster.
async fn report_held(ctx: &SweepContext, ic: &InferenceCluster, s: &Swept) {
    let ev = held_event(s, ctx.max_share);
    if let Err(e) = ctx.recorder.publish(&ev, &kube::Resource::object_ref(ic, &())).await {
        tracing::debug!(error = %brief(&e), "SweepHeld event not recorded");
    }
}

/// One periodic pass over every member that is not being deleted, concurrently.
pub async fn pass(ctx: &SweepContext) {
    let owners = Owners::from_stores(&ctx.deployments, &ctx.caches);
    let namespaces = owners.namespaces();
    let clusters: Vec<Arc<InferenceCluster>> =
        ctx.clusters.state().into_iter().filter(|c| c.metadata.deletion_timestamp.is_none()).collect();
    let work: Vec<_> = clusters.iter().map(|ic| {
        let (owners, namespaces) = (&owners, &namespaces);
        async move {
            let name = ic.name_any();
            let handle = match ctx.members.handle(&ctx.client, ic, ctx.timeouts).await {
                Ok(h) => h,
                Err(e) => return tracing::debug!(cluster = %name, "sweep skipped: {e}"),
            };
            let first = !handle.objects.swept_once.load(std::sync::atomic::Ordering::Relaxed);
            let scope = Scope {
                owners,
                namespaces,
                install: &ctx.install,
                grace: ctx.grace,
                cluster: None,
                max_share: Some(ctx.max_share),
                approved: approved(ic),
                list_all: false,
            };
            match member(&handle, &scope, ctx.timeouts).await {
                Ok(s) if s.held => {
                    ctx.metrics.swept(SweepOutcome::Held);
                    tracing::warn!(cluster = %name, orphaned = s.orphaned, found = s.found, max_share = ctx.max_share,
                        "sweep held: it would delete more than the bounded share of this installation's objects in the member; nothing deleted");
                    report_held(ctx, ic, &s).await;
                }
                Ok(s) => {
                    ctx.metrics.swept(if s.approved { SweepOutcome::Approved } else { SweepOutcome::Swept });
                    if s.deleted > 0 {
                        tracing::info!(cluster = %name, deleted = s.deleted, orphaned = s.orphaned, found = s.found, approved = s.approved,
                            "sweep removed objects no ModelDeployment or ModelCache owns");
                    }
                    // The first pass lists what the caches do not hold (objects from before this
                    // controller); later ones read the caches only.
                    if first {
                        tracing::debug!(cluster = %name, "sweep: first pass over the member done");
                    }
                }
                Err(e) => tracing::debug!(cluster = %name, "sweep skipped: {e}"),
            }
        }
    }).collect();
    // A thousand members are not all swept at once: at most MEMBERS_AT_ONCE at a time, each
    // bounded by its timeout.
    futures_util::stream::iter(work).buffer_unordered(MEMBERS_AT_ONCE).collect::<Vec<()>>().await;
}

/// Sweeps every `every` until `shutdown` resolves (the first pass after one period). Tried at
/// start-up instead: in one of two `e2e_deployment` runs a member's first pass (which lists
/// every kind once) then came again later, inside the test's quiet minute; not understood yet,
/// so the first pass stays one period after the start.
pub async fn run(ctx: SweepContext, every: Duration, shutdown: impl std::future::Future<Output = ()>) {
    let passes = async {
        loop {
            tokio::time::sleep(every).await;
            pass(&ctx).await;
        }
    };
    tokio::select! { () = passes => {}, () = shutdown => {} }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_makes_at_most_its_budget_of_namespace_lists_and_the_next_continues() {
        // 100 namespace LISTs, 32 a pass: four passes cover them, the fourth says so.
        assert_eq!(window(100, 0, Some(32)), (0..32, false));
        assert_eq!(window(100, 32, Some(32)), (32..64, false));
        assert_eq!(window(100, 96, Some(32)), (96..100, true));
        // Fewer than the budget: one pass, complete.
        assert_eq!(window(5, 0, Some(32)), (0..5, true));
        // The namespaces shrank under the cursor: start again from the first.
        assert_eq!(window(10, 40, Some(32)), (0..10, true));
        // No budget (an InferenceCluster's deletion): every one.
        assert_eq!(window(1000, 0, None), (0..1000, true));
        assert_eq!(window(0, 0, Some(32)), (0..0, true));
    }

    #[test]
    fn the_cache_kinds_are_listed_only_where_some_may_be() {
        // First pass: everything, whatever the flag says.
        assert_eq!(kinds_to_list(true, false), 0..KINDS.len());
        assert_eq!(kinds_to_list(true, true), 0..KINDS.len());
        // Later: the ModelCache kinds (never a cached one) where some may be…
        let cache_kinds = kinds_to_list(false, true);
        assert_eq!(cache_kinds, CACHED_KINDS..KINDS.len());
        assert!(cache_kinds.clone().all(|i| KINDS[i].3 == labels::CACHE), "{cache_kinds:?}");
        // …and nothing at all in a member where none can be: a quiet fleet lists nothing.
        assert!(kinds_to_list(false, false).is_empty());
    }

    fn f(kind: usize, owner: &str, name: &str, age: u64) -> Found {
        Found {
            kind,
            namespace: owner.split('.').next().unwrap().into(),
            name: name.into(),
            owner: owner.into(),
            cluster: None,
            age: Duration::from_secs(age),
            deleting: false,
        }
    }

    fn owners() -> Owners {
        Owners {
            deployments: ["ml.llama".to_string()].into_iter().collect(),
            caches: ["ml.weights".to_string()].into_iter().collect(),
        }
    }

    #[test]
    fn only_objects_whose_owner_is_gone_are_swept() {
        let found = [
            f(0, "ml.llama", "llama-h100", 600),  // owned
            f(1, "ml.gone", "gone", 600),         // owner deleted
            f(2, "ml.gone", "gone-h100", 600),    // its PodDisruptionBudget too
            f(2, "ml.llama", "llama-h100", 600),  // owned
            f(6, "ml.weights", "stage-1", 600),   // cache owns it
            f(6, "ml.llama", "stage-2", 600),     // a Job is owned by a cache, not a deployment
            f(0, "ml.weights", "weights-x", 600), // a Deployment is owned by a deployment
        ];
        assert_eq!(KINDS[2].2, "PodDisruptionBudget");
        assert_eq!(KINDS[6].2, "Job");
        let names: Vec<String> = orphans(&found, &owners(), GRACE, None, 10).into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["weights-x", "gone", "gone-h100", "stage-2"], "by kind, namespace, name");
    }

    #[test]
    fn young_or_deleting_objects_wait_and_a_pass_is_bounded() {
        let mut deleting = f(0, "ml.gone", "b", 600);
        deleting.deleting = true;
        let found = [f(0, "ml.gone", "young", 5), deleting, f(0, "ml.gone", "c", 600), f(0, "ml.gone", "a", 600)];
        let names: Vec<String> = orphans(&found, &owners(), GRACE, None, 1).into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["a"], "the first in a stable order, one per pass");
        assert!(orphans(&found[..1], &owners(), GRACE, None, 10).is_empty(), "younger than the grace period");
    }

    #[test]
    fn with_no_owner_at_all_everything_labelled_goes() {
        let found = [f(0, "ml.llama", "x", 0), f(8, "ml.weights", "y", 0)];
        assert_eq!(orphans(&found, &Owners::default(), Duration::ZERO, None, 10).len(), 2);
    }

    #[test]
    fn a_long_named_deployments_objects_are_its_own_not_orphans() {
        // `<ns>.<name>` past 63 characters: the label carries it shortened with a hash, and the
        // owners the sweep compares with must be spelled the same way.
        let md: ModelDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "a".repeat(62), "namespace": "ml"},
            "spec": {"model": {"name": "m", "source": "hf://o/m"}, "replicas": 1, "engine": {"image": "i"},
                     "topology": {"type": "Standalone", "devicesPerReplica": 1},
                     "devices": {"alternatives": [{"class": "h100"}]}}
        }))
        .unwrap();
        let mut deployments = kube::runtime::reflector::store::Writer::<ModelDeployment>::default();
        deployments.apply_watcher_event(&kube::runtime::watcher::Event::Apply(md.clone()));
        let caches = kube::runtime::reflector::store::Writer::<ModelCache>::default();
        let owners = Owners::from_stores(&deployments.as_reader(), &caches.as_reader());
        let label = crate::render::deployment_key(&md);
        assert!(label.len() <= 63, "{label}");
        let found = [f(0, &label, "svc", 3600)];
        assert!(orphans(&found, &owners, GRACE, None, MAX_DELETES).is_empty(), "its own object is not swept");
        assert_eq!(owners.namespaces().into_iter().collect::<Vec<_>>(), ["ml"]);
    }

    #[test]
    fn the_namespaces_of_tenant_objects() {
        let ns: Vec<String> = owners().namespaces().into_iter().collect();
        assert_eq!(ns, ["ml"]);
    }

    #[test]
    fn a_cluster_deletion_takes_only_what_was_written_through_it() {
        let mut a = f(0, "ml.llama", "a", 600);
        a.cluster = Some("eu1".into());
        let mut b = f(0, "ml.llama", "b", 600);
        b.cluster = Some("eu1-again".into());
        let unlabelled = f(1, "ml.llama", "c", 600);
        let found = [a, b, unlabelled];
        let names: Vec<String> =
            orphans(&found, &Owners::default(), Duration::ZERO, Some("eu1"), 10).into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["a"], "the other InferenceCluster's objects and unlabelled ones stay");
    }

    #[test]
    fn only_this_installations_labelled_objects_are_found() {
        let meta = |install: Option<&str>, managed: &str| ObjectMeta {
            name: Some("x".into()),
            namespace: Some("ml".into()),
            labels: Some(
                [(labels::DEPLOYMENT, "ml.llama"), (labels::MANAGED_BY, managed)]
                    .into_iter()
                    .chain(install.map(|i| (labels::INSTALL, i)))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        };
        let now = Timestamp::now();
        assert!(found(0, &meta(Some("prod"), "flotilla"), now, "prod").is_some());
        assert!(found(0, &meta(Some("staging"), "flotilla"), now, "prod").is_none(), "another installation's");
        assert!(found(0, &meta(None, "flotilla"), now, "prod").is_none(), "a release before install labels");
        assert!(found(0, &meta(Some("prod"), "helm"), now, "prod").is_none(), "not Flotilla's");
    }

    #[test]
    fn a_held_events_series_changes_with_its_count() {
        let s = |orphaned| Swept { found: 15, orphaned, held: true, ..Swept::default() };
        let (a, b) = (held_event(&s(11), 50), held_event(&s(12), 50));
        assert!(
            a.note.as_deref().unwrap().contains("delete 11 of the 15") && a.note.as_deref().unwrap().contains("=11 ")
        );
        assert!(
            b.note.as_deref().unwrap().contains("delete 12 of the 15") && b.note.as_deref().unwrap().contains("=12 ")
        );
        // The recorder's series key: reason and action (same object, same reporter).
        assert_eq!(a.reason, b.reason);
        assert_ne!(a.action, b.action, "another count is another series, with its own note");
        assert_eq!(a.action, held_event(&s(11), 50).action, "the same count repeats as one series");
    }

    #[test]
    fn a_sweep_past_the_share_bound_is_held_until_approved() {
        assert_eq!(gate(3, 4, Some(50), None), Gate::Proceed, "a few always go");
        assert_eq!(gate(ALWAYS, ALWAYS, Some(0), None), Gate::Proceed);
        assert_eq!(gate(50, 100, Some(50), None), Gate::Proceed, "at the bound");
        assert_eq!(gate(51, 100, Some(50), None), Gate::Held, "past it");
        assert_eq!(gate(180, 200, Some(50), Some(179)), Gate::Held, "approving fewer does not do");
        assert_eq!(gate(180, 200, Some(50), Some(180)), Gate::Approved);
        assert_eq!(gate(500, 500, None, None), Gate::Proceed, "an InferenceCluster's deletion has no bound");
        let mut ic = InferenceCluster::new(
            "eu1",
            serde_json::from_value(serde_json::json!({
            "provider": {"sim": {"cloud": "x"}}, "region": "r", "jurisdiction": "EU", "pools": []}))
            .unwrap(),
        );
        assert_eq!(approved(&ic), None);
        ic.metadata.annotations = Some([(annotations::APPROVE_SWEEP.to_string(), " 180".to_string())].into());
        assert_eq!(approved(&ic), Some(180));
        ic.metadata.annotations = Some([(annotations::APPROVE_SWEEP.to_string(), "all".to_string())].into());
        assert_eq!(approved(&ic), None, "a number, nothing else");
    }
}
