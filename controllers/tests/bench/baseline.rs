//! The baseline Flotilla is measured against, in the same run on the same members: the very
//! objects Flotilla would render, applied straight to the members. The fleet is solved once by
//! the controller's solver (`flotilla_placement::Replanner`, as the ModelDeployment controller
//! runs it) on the capacity the controller's own inventory code (`inventory::observe`,
//! `cluster::desired_status`) reads from the members' nodes and ResourceSlices; each member's
//! share is rendered by `render::render` and written by the controller's own writer
//! (`members::apply_with`: the same labels, hash annotation, field manager and server-side
//! apply), `--deployment-concurrency` deployments at a time, each writing its members in turn,
//! as the controller's reconciles do. No control cluster, no status, no ownership check before a
//! first write. Measured: first apply → every deployment's pods Ready on the members
//! (`readyReplicas` of its Deployments), and, after stopping the member the Flotilla phase will
//! stop, a re-plan without it (the same `Replanner`) → the objects it moves applied → every
//! deployment that had replicas there Ready elsewhere. Then every baseline object is deleted,
//! the stopped member started again, and the benchmark waits until the members hold none of
//! them (pods and claims included), so the Flotilla phase starts from the same members.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::constants::labels;
use flotilla_apis::{InferenceClass, InferenceCluster, ModelDeployment};
use flotilla_controllers::cluster::{Observed, desired_status};
use flotilla_controllers::deployment::members::{MemberState, Stamp, apply_with};
use flotilla_controllers::inventory::{MemberObservation, observe};
use flotilla_controllers::member::MemberObjects;
use flotilla_controllers::render::{MANAGED_BY, PoolWorkload, deployment_key, render};
use flotilla_controllers::{ControllerConfig, DEFAULT_INSTALL_ID};
use flotilla_placement::{FleetSnapshot, Plan, Replanner, SolveOptions};
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use crate::fleet::Params;
use crate::harness::{Fleet, apiserver};
use crate::{Servers, Watched, Window, begin, secs, until, watch_with};

/// No process has pid 0 in `/proc`: the windows of the baseline read 0 controller CPU seconds
/// (none runs).
const NO_CONTROLLER: u32 = 0;

/// What the baseline measured.
pub struct Baseline {
    /// The member stopped (here and in the Flotilla phase): the one the baseline's plan gives the
    /// most replicas, never the only one of its jurisdiction.
    pub victim: String,
    /// Replicas the plan placed, of those asked.
    pub placed: (u32, u32),
    /// Observing the members and solving the fleet (before the first apply, not measured in it).
    pub solved: Duration,
    /// Objects written in the first apply.
    pub objects: usize,
    /// First apply → the last one answered.
    pub applied: Duration,
    /// First apply → every deployment's pods Ready.
    pub ready: Option<Duration>,
    /// Deployments with replicas on the victim, and those replicas.
    pub affected: usize,
    pub replicas_there: u32,
    /// (deployment, member) object sets the re-plan changed, written in the outage.
    pub moved: usize,
    /// Member stopped → every affected deployment Ready elsewhere.
    pub replaced: Option<Duration>,
    /// Deleting every baseline object → none left (the victim started again first; kwok's
    /// confirmation of the victim's pod deletions takes most of it).
    pub cleaned: Option<Duration>,
    /// Writes the members refused (should be none), with the first refusal.
    pub refused: (usize, String),
}

/// One member: its admin client and the writer's memo of it.
struct Member {
    name: String,
    client: Client,
    known: MemberObjects,
}

/// Runs the baseline; its measured windows are added to `windows`.
pub async fn run(
    fleet: &Fleet,
    control: &Client,
    p: &Params,
    members: &[(String, Client)],
    servers: &Servers,
    windows: &mut Vec<Window>,
) -> Baseline {
    let started = Instant::now();
    let classes: Vec<InferenceClass> = Api::all(control.clone()).list(&ListParams::default()).await.unwrap().items;
    let specs: BTreeMap<String, InferenceClassSpec> = classes.iter().map(|c| (c.name_any(), c.spec.clone())).collect();
    let clusters: Vec<InferenceCluster> = Api::all(control.clone()).list(&ListParams::default()).await.unwrap().items;
    let mut observed = Vec::new();
    let mut dra = BTreeMap::new();
    for ic in clusters {
        let client = &members.iter().find(|(n, _)| *n == ic.name_any()).unwrap().1;
        let (status, has_dra) = inventory_of(client, &ic, &specs).await;
        dra.insert(ic.name_any(), has_dra);
        observed.push(InferenceCluster { status: Some(status), ..ic });
    }
    let mds: Vec<ModelDeployment> = (0..p.deployments)
        .map(|i| {
            let mut md: ModelDeployment = serde_json::from_value(p.deployment(i)).unwrap();
            md.metadata.generation = Some(1);
            md
        })
        .collect();
    let snapshot = FleetSnapshot::from_live(classes, observed, [], mds.clone());
    let mut replanner = Replanner::new(&snapshot, SolveOptions::default());
    let plan = replanner.plan().clone();
    let solved = started.elapsed();
    let asked: u32 = mds.iter().map(|d| d.spec.replicas as u32).sum();
    let placed: u32 = plan.deployments.iter().flat_map(|d| &d.assignments).map(|a| a.replicas).sum();
    let on = |m: &str| -> u32 {
        plan.deployments.iter().flat_map(|d| &d.assignments).filter(|a| a.cluster == m).map(|a| a.replicas).sum()
    };
    let names = p.member_names();
    let victim = names
        .iter()
        .enumerate()
        .filter(|(i, _)| !p.is_eu(*i) || p.eu_members() >= 2)
        .max_by_key(|(_, m)| on(m))
        .map(|(_, m)| m.clone())
        .unwrap();
    let rendered: Vec<BTreeMap<String, Vec<Value>>> =
        mds.iter().map(|md| objects_of(md, &plan, &specs, &dra, None)).collect();
    let objects: usize = rendered.iter().flat_map(|r| r.values()).map(Vec::len).sum();
    println!(
        "# baseline: fleet observed and solved in {:.1} s: {placed} of {asked} replicas placed, {objects} objects; {victim} runs the most ({})",
        solved.as_secs_f64(),
        on(&victim)
    );
    let ms: Vec<Member> = members
        .iter()
        .map(|(n, c)| Member { name: n.clone(), client: c.clone(), known: MemberObjects::new(c.clone()) })
        .collect();
    // Every deployment's Deployments on every member, watched (one LIST each, before the window).
    let selector = format!("{}={MANAGED_BY}", labels::MANAGED_BY);
    let mut stores: Vec<(String, Watched<Deployment>)> = Vec::new();
    for (n, c) in members {
        let api = Api::<Deployment>::namespaced(c.clone(), "ml");
        stores.push((n.clone(), watch_with(api, watcher::Config::default().labels(&selector)).await));
    }
    let want: BTreeMap<String, i32> = mds.iter().map(|md| (deployment_key(md), md.spec.replicas)).collect();
    let mut refused = (0, String::new());

    // Convergence: first apply → every deployment's pods Ready.
    let meter = begin(servers, NO_CONTROLLER).await;
    let start = Instant::now();
    let line = timeline("baseline", views(&stores), want.clone(), None);
    let writes = mds.iter().zip(&rendered).map(|(md, objs)| write_all(&ms, md, objs));
    let results: Vec<Vec<String>> =
        futures_util::stream::iter(writes).buffer_unordered(p.deployment_concurrency as usize).collect().await;
    let applied = start.elapsed();
    note_refusals(&mut refused, results);
    let timeout = Duration::from_secs(p.timeout_seconds);
    let ready =
        until(timeout, || ready_count(&views(&stores), &want, None) == want.len()).await.map(|_| start.elapsed());
    line.abort();
    windows.push(meter.end("baseline: convergence (apply → all Ready)", servers, NO_CONTROLLER).await);
    println!("# baseline: applied in {:.1} s, all Ready {}", applied.as_secs_f64(), secs(ready));

    // The outage: the member stops; a re-plan without it; what it moves is applied.
    let affected: BTreeMap<String, i32> = mds
        .iter()
        .filter(|md| plan_of(&plan, md).is_some_and(|d| d.assignments.iter().any(|a| a.cluster == victim)))
        .map(|md| (deployment_key(md), md.spec.replicas))
        .collect();
    let replicas_there = on(&victim);
    let meter = begin(servers, NO_CONTROLLER).await;
    let start = Instant::now();
    let line = timeline("baseline outage", views(&stores), affected.clone(), Some(victim.clone()));
    fleet.stop(&victim);
    let mut without = snapshot.clone();
    for d in &mut without.deployments {
        let current = plan.get(&d.namespace, &d.name).map(|e| e.assignments.as_slice()).unwrap_or_default();
        d.current = current.iter().map(|a| a.to_placement(a.replicas as i32)).collect();
    }
    for c in without.clusters.iter_mut().filter(|c| c.name == victim) {
        c.ready = false;
        c.not_ready_reason = Some("the member stopped answering".into());
    }
    let replan = replanner.replan(&without).clone();
    let mut moved = Vec::new();
    for (md, before) in mds.iter().zip(&rendered) {
        let after = objects_of(md, &replan, &specs, &dra, Some(&victim));
        let changed: BTreeMap<String, Vec<Value>> =
            after.into_iter().filter(|(c, objs)| before.get(c) != Some(objs)).collect();
        if !changed.is_empty() {
            moved.push((md, changed));
        }
    }
    let n_moved = moved.iter().map(|(_, c)| c.len()).sum();
    let writes = moved.iter().map(|(md, objs)| write_all(&ms, md, objs));
    let results: Vec<Vec<String>> =
        futures_util::stream::iter(writes).buffer_unordered(p.deployment_concurrency as usize).collect().await;
    note_refusals(&mut refused, results);
    let outage_timeout = Duration::from_secs(p.timeout_seconds.min(600));
    let replaced = until(outage_timeout, || ready_count(&views(&stores), &affected, Some(&victim)) == affected.len())
        .await
        .map(|_| start.elapsed());
    line.abort();
    windows.push(meter.end(&format!("baseline: outage of {victim} (until re-placed)"), servers, NO_CONTROLLER).await);
    for (_, w) in &stores {
        w.task.abort();
    }
    println!("# baseline: outage of {victim}: {n_moved} object sets moved, re-placed and Ready {}", secs(replaced));

    // Clean-up: the victim back, every baseline object deleted and gone.
    let start = Instant::now();
    fleet.start(&victim);
    let back = &ms.iter().find(|m| m.name == victim).unwrap().client;
    for _ in 0..240 {
        if back.apiserver_version().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut all: Vec<(&Member, Value)> = Vec::new();
    for objs in rendered.iter().chain(moved.iter().map(|(_, o)| o)) {
        for (cluster, list) in objs {
            let m = ms.iter().find(|m| m.name == *cluster).unwrap();
            all.extend(list.iter().map(|o| (m, o.clone())));
        }
    }
    let deletes = all.iter().map(|(m, o)| delete(&m.client, o));
    futures_util::stream::iter(deletes).buffer_unordered(16).collect::<Vec<()>>().await;
    let cleaned = gone(&ms, &selector, timeout).await.map(|_| start.elapsed());
    println!("# baseline: every object deleted and gone {}", secs(cleaned));
    Baseline {
        victim,
        placed: (placed, asked),
        solved,
        objects,
        applied,
        ready,
        affected: affected.len(),
        replicas_there,
        moved: n_moved,
        replaced,
        cleaned,
        refused,
    }
}

/// The member's InferenceCluster status as the controller would write it first (its inventory
/// of the member's nodes, ResourceSlices, pods and claims), and whether it has DRA devices.
async fn inventory_of(
    client: &Client,
    ic: &InferenceCluster,
    classes: &BTreeMap<String, InferenceClassSpec>,
) -> (flotilla_apis::cluster::InferenceClusterStatus, bool) {
    let lp = ListParams::default();
    let pods = Api::<Pod>::all(client.clone()).list(&lp).await.unwrap().items;
    let claims = Api::<ResourceClaim>::all(client.clone()).list(&lp).await.unwrap().items;
    let seen = MemberObservation {
        nodes: Api::<Node>::all(client.clone()).list(&lp).await.unwrap().items,
        slices: Api::<ResourceSlice>::all(client.clone()).list(&lp).await.unwrap().items,
        pods: pods
            .into_iter()
            .filter(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")))
            .collect(),
        claims: claims.into_iter().filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some())).collect(),
    };
    let inventory = observe(&ic.spec.pools, classes, &seen);
    let dra = inventory.dra;
    let version = client.apiserver_version().await.unwrap().git_version;
    let now = k8s_openapi::jiff::Timestamp::now();
    let status =
        desired_status(None, ic.metadata.generation, &Observed::Ok { inventory, version }, now, Duration::ZERO);
    (status, dra)
}

fn plan_of<'a>(plan: &'a Plan, md: &ModelDeployment) -> Option<&'a flotilla_placement::DeploymentPlan> {
    plan.get(md.metadata.namespace.as_deref().unwrap_or("default"), md.metadata.name.as_deref().unwrap_or(""))
}

/// Per member, what `render` gives `md` for the plan's assignments there (as the controller's
/// decision renders a settled deployment), leaving out `skip`.
fn objects_of(
    md: &ModelDeployment,
    plan: &Plan,
    classes: &BTreeMap<String, InferenceClassSpec>,
    dra: &BTreeMap<String, bool>,
    skip: Option<&str>,
) -> BTreeMap<String, Vec<Value>> {
    let mut pools: BTreeMap<&str, Vec<PoolWorkload<'_>>> = BTreeMap::new();
    for a in plan_of(plan, md).iter().flat_map(|d| &d.assignments) {
        if Some(a.cluster.as_str()) == skip || a.replicas == 0 {
            continue;
        }
        let (Some(class), Some(alternative)) =
            (classes.get(&a.class), md.spec.devices.alternatives.get((a.fallback_rank as usize).saturating_sub(1)))
        else {
            continue;
        };
        pools.entry(&a.cluster).or_default().push(PoolWorkload {
            pool: &a.pool,
            class,
            alternative,
            replicas: a.replicas as i32,
        });
    }
    pools
        .into_iter()
        .map(|(c, w)| (c.to_string(), render(md, &w, dra.get(c).copied().unwrap_or(false), None, None, &[])))
        .collect()
}

/// Writes one deployment's objects to each of its members in turn with the controller's writer;
/// the refusals, if any.
async fn write_all(members: &[Member], md: &ModelDeployment, objects: &BTreeMap<String, Vec<Value>>) -> Vec<String> {
    let config = ControllerConfig::default();
    let mut refused = Vec::new();
    for (cluster, objs) in objects {
        let m = members.iter().find(|m| m.name == *cluster).unwrap();
        // Every object taken as known to be ours (`Kind/name` in `specs`, no hash): the writer
        // then skips its ownership check (a LIST by name before a first write) and writes each.
        let specs = objs
            .iter()
            .map(|o| {
                (
                    format!("{}/{}", o["kind"].as_str().unwrap_or(""), o["metadata"]["name"].as_str().unwrap_or("")),
                    Value::Null,
                )
            })
            .collect();
        let state = MemberState { specs, ..Default::default() };
        let stamp = Stamp { install: DEFAULT_INSTALL_ID, cluster };
        let result =
            apply_with(&m.client, &config.field_manager, stamp, objs, &state, Some(&m.known), |_, _, _, _, _| {}).await;
        if let Err(e) = result {
            refused.push(format!("{} on {cluster}: {e}", md.name_any()));
        }
    }
    refused
}

fn note_refusals(into: &mut (usize, String), results: Vec<Vec<String>>) {
    for r in results.into_iter().flatten() {
        if into.0 == 0 {
            into.1 = r;
        }
        into.0 += 1;
    }
}

async fn delete(client: &Client, obj: &Value) {
    let api_version = obj["apiVersion"].as_str().unwrap_or("v1");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap_or("")));
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or("ml");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    match api.delete(obj["metadata"]["name"].as_str().unwrap_or(""), &DeleteParams::background()).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => println!("# baseline: cannot delete {}: {e}", obj["metadata"]["name"]),
    }
}

/// Waits until no member holds a Deployment, ReplicaSet, pod or ResourceClaim with Flotilla's
/// labels in `ml`; every 10 s a line says what is left where. Pods are not force-deleted: on a
/// member just started again kwok confirms no deletion for about three minutes, and new pods
/// there would wait as long, so their going is also the sign the member works again.
async fn gone(members: &[Member], selector: &str, timeout: Duration) -> Option<()> {
    let lp = ListParams::default().labels(selector);
    let start = Instant::now();
    let mut said = Instant::now();
    while start.elapsed() < timeout {
        let mut left = Vec::new();
        for m in members {
            let c = &m.client;
            let counts = [
                (
                    "Deployments",
                    Api::<Deployment>::namespaced(c.clone(), "ml").list_metadata(&lp).await.map(|l| l.items.len()),
                ),
                (
                    "ReplicaSets",
                    Api::<ReplicaSet>::namespaced(c.clone(), "ml").list_metadata(&lp).await.map(|l| l.items.len()),
                ),
                ("pods", Api::<Pod>::namespaced(c.clone(), "ml").list_metadata(&lp).await.map(|l| l.items.len())),
                (
                    "ResourceClaims",
                    Api::<ResourceClaim>::namespaced(c.clone(), "ml").list_metadata(&lp).await.map(|l| l.items.len()),
                ),
            ];
            let here: Vec<String> = counts
                .iter()
                .filter_map(|(kind, n)| match n {
                    Ok(0) => None,
                    Ok(n) => Some(format!("{n} {kind}")),
                    Err(e) => Some(format!("{kind}: {e}")),
                })
                .collect();
            if !here.is_empty() {
                left.push(format!("{}: {}", m.name, here.join(", ")));
            }
        }
        if left.is_empty() {
            return Some(());
        }
        if said.elapsed() >= Duration::from_secs(10) {
            println!("# baseline clean-up +{:.0} s: left {}", start.elapsed().as_secs_f64(), left.join("; "));
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    None
}

fn views(stores: &[(String, Watched<Deployment>)]) -> Vec<(String, Store<Deployment>)> {
    stores.iter().map(|(n, w)| (n.clone(), w.store.clone())).collect()
}

/// How many of `want`'s deployments have at least their replicas Ready on the members other than
/// `skip` (the `readyReplicas` of their Deployments, by the deployment label).
fn ready_count(stores: &[(String, Store<Deployment>)], want: &BTreeMap<String, i32>, skip: Option<&str>) -> usize {
    let mut ready: BTreeMap<String, i32> = BTreeMap::new();
    for (_, store) in stores.iter().filter(|(n, _)| Some(n.as_str()) != skip) {
        for d in store.state() {
            let Some(key) = d.labels().get(labels::DEPLOYMENT) else { continue };
            *ready.entry(key.clone()).or_default() += d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
        }
    }
    want.iter().filter(|(k, r)| ready.get(*k).copied().unwrap_or(0) >= **r).count()
}

/// Every 10 s until aborted: `# <what> +20 s: N of M deployments Ready; machine X cores`.
fn timeline(
    what: &'static str,
    stores: Vec<(String, Store<Deployment>)>,
    want: BTreeMap<String, i32>,
    skip: Option<String>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let start = Instant::now();
        let mut busy = apiserver::machine_busy_seconds();
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let b = apiserver::machine_busy_seconds();
            println!(
                "# {what} +{:.0} s: {} of {} deployments Ready; machine {:.2} cores",
                start.elapsed().as_secs_f64(),
                ready_count(&stores, &want, skip.as_deref()),
                want.len(),
                (b - busy) / 10.0
            );
            busy = b;
        }
    })
}
