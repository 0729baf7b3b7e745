//! A benchmark, not a test: the controller at fleet scale on real API servers (kwok members).
//! `FLOTILLA_BENCH_DEPLOYMENTS` ModelDeployments over `FLOTILLA_BENCH_MEMBERS` member clusters
//! with `FLOTILLA_BENCH_NODES` GPU nodes each (an H100 and an A100 pool; 40 % of the members
//! EU, two per region; a third of the deployments EU-only, mixed sizes, fallbacks and spread —
//! `bench/fleet.rs`). First a baseline on the same members (`bench/baseline.rs`): the very
//! objects Flotilla would render for the fleet, applied straight to the members with the
//! controller's parallelism, until their pods are Ready; the member the Flotilla phase will
//! stop stopped, what a re-plan without it moves applied, until Ready elsewhere; then all of it
//! deleted and the member started again. Then Flotilla, measured watching the control cluster
//! and never asking the controller: apply → every deployment `Placed` and `Ready`; the
//! controller's CPU seconds and peak RSS (`/proc`); the requests each API server counted
//! (`apiserver_request_total`) by verb during start-up, convergence, a steady window (with
//! ModelCaches staged and inventory churn on some members: `bench/steady.rs`), the same
//! member's outage (until its replicas run elsewhere) and its recovery; and, from each API
//! server's audit log, the LISTs and writes sent with the controller's User-Agent (the metric
//! counts every client, the log names them). It prints Markdown rows for `docs/benchmarks.md`
//! (`bench/report.rs`: Flotilla's convergence and outage as multiples of the baseline's, its CPU
//! seconds per 1,000 deployments, the steady window's LISTs and writes per minute per API
//! server) and never asserts on time. Run by `scripts/bench-convergence.sh`; ignored in the
//! test command.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "bench/baseline.rs"]
mod baseline;
#[path = "bench/fleet.rs"]
mod fleet;
mod harness;
#[path = "bench/report.rs"]
mod report;
#[path = "bench/steady.rs"]
mod steady;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flotilla_apis::{InferenceCluster, ModelDeployment};
use futures_util::StreamExt;
use harness::apiserver::{self, Requests};
use harness::{ControllerProcess, Fleet};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use fleet::Params;

/// A watch of one kind (one LIST when it starts, then WATCH only, so the benchmark adds no LIST
/// to the windows it measures), a count of the changes it saw, and its task.
struct Watched<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    changes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

async fn watch<K>(api: Api<K>) -> Watched<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    watch_with(api, watcher::Config::default()).await
}

async fn watch_with<K>(api: Api<K>, config: watcher::Config) -> Watched<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let changes = Arc::new(AtomicUsize::new(0));
    let n = changes.clone();
    let events = watcher(api, config).inspect(move |e| {
        if matches!(e, Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    });
    let stream = reflector::reflector(writer, events).default_backoff().applied_objects();
    let task = tokio::spawn(async move { stream.for_each(|_| async {}).await });
    store.wait_until_ready().await.unwrap();
    Watched { store, changes, task }
}

/// Polls `done` every 250 ms until it holds or `timeout` passes; the time it took, if it held.
async fn until(timeout: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if done() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "not reached".to_string(), |d| format!("{:.1} s", d.as_secs_f64()))
}

fn all_ready(store: &Store<ModelDeployment>, condition: &str) -> usize {
    store.state().iter().filter(|d| d.status.as_ref().is_some_and(|s| s.conditions.is_true(condition))).count()
}

/// Every API server's reading, by name (`None` for one that does not answer), and its audit
/// log (LISTs and writes with the client's User-Agent).
struct Servers {
    clients: Vec<(String, Client)>,
    audits: Vec<(String, PathBuf)>,
    /// Where every harness cluster's processes keep their files (`processes_under`).
    clusters_dir: PathBuf,
}

impl Servers {
    async fn read(&self) -> BTreeMap<String, Option<Requests>> {
        let reads =
            self.clients.iter().map(|(n, c)| async move { (n.clone(), apiserver::apiserver_requests(c).await) });
        futures_util::future::join_all(reads).await.into_iter().collect()
    }

    fn audit_ends(&self) -> BTreeMap<String, u64> {
        self.audits.iter().map(|(n, log)| (n.clone(), apiserver::audit_end(log))).collect()
    }

    /// Per server, the LISTs and writes the controller's User-Agent made since `from`.
    fn audited(&self, from: &BTreeMap<String, u64>) -> BTreeMap<String, Requests> {
        self.audits
            .iter()
            .map(|(n, log)| {
                let at = from.get(n).copied().unwrap_or(0);
                (n.clone(), apiserver::audited(log, flotilla_controllers::USER_AGENT, at))
            })
            .collect()
    }
}

/// One measured window: how long, the controller's CPU in it, and each server's difference.
struct Window {
    name: String,
    took: Duration,
    cpu: f64,
    grown: BTreeMap<String, Requests>,
    /// Per server, the controller's own LISTs and writes, from the audit log (its User-Agent).
    audited: BTreeMap<String, Requests>,
    cores: Cores,
}

/// Where the machine's CPU went in a window, in CPU seconds: the harness's programs (every
/// cluster's, summed by program), the benchmark's own process and the whole machine's busy time.
struct Cores {
    harness: BTreeMap<apiserver::Program, f64>,
    benchmark: f64,
    machine: f64,
}

struct Meter {
    before: BTreeMap<String, Option<Requests>>,
    audit_from: BTreeMap<String, u64>,
    cpu: f64,
    procs: BTreeMap<u32, (apiserver::Program, f64)>,
    own: f64,
    busy: f64,
    start: Instant,
}

async fn begin(servers: &Servers, pid: u32) -> Meter {
    let cpu = apiserver::proc_stats(pid).unwrap_or_default().cpu_seconds;
    let before = servers.read().await;
    Meter {
        before,
        audit_from: servers.audit_ends(),
        cpu,
        procs: apiserver::cpu_by_process(&servers.clusters_dir),
        own: apiserver::proc_stats(std::process::id()).unwrap_or_default().cpu_seconds,
        busy: apiserver::machine_busy_seconds(),
        start: Instant::now(),
    }
}

impl Meter {
    async fn end(self, name: &str, servers: &Servers, pid: u32) -> Window {
        let took = self.start.elapsed();
        let after = servers.read().await;
        let cpu = apiserver::proc_stats(pid).unwrap_or_default().cpu_seconds - self.cpu;
        let cores = Cores {
            harness: apiserver::cpu_grown(&self.procs, &apiserver::cpu_by_process(&servers.clusters_dir)),
            benchmark: apiserver::proc_stats(std::process::id()).unwrap_or_default().cpu_seconds - self.own,
            machine: apiserver::machine_busy_seconds() - self.busy,
        };
        // The API server writes an audit line as the response completes: a moment for the last.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let audited = servers.audited(&self.audit_from);
        let grown = after
            .iter()
            .filter_map(|(n, a)| {
                let (b, a) = (self.before.get(n)?.as_ref()?, a.as_ref()?);
                Some((n.clone(), apiserver::grown(b, a)))
            })
            .collect();
        Window { name: name.to_string(), took, cpu, grown, audited, cores }
    }
}

/// The idle cost of one harness cluster, sampled over `over`: (RSS MiB, CPU cores).
async fn cluster_cost(fleet: &Fleet, name: &str, over: Duration) -> (f64, f64, usize) {
    let pids = apiserver::processes_under(&fleet.dir.join("kwok/clusters").join(name));
    let a = apiserver::sum_stats(&pids);
    tokio::time::sleep(over).await;
    let b = apiserver::sum_stats(&pids);
    (b.rss_mib, (b.cpu_seconds - a.cpu_seconds) / over.as_secs_f64(), pids.len())
}

/// Prints, every `every` until aborted, how many deployments are `Placed` and `Ready` and how
/// busy the machine and the controller were since the last line (`# <what> +12 s: …`): where a
/// window's time goes, the controller's decisions or the members' pods.
fn timeline(
    what: &'static str,
    store: Store<ModelDeployment>,
    pid: u32,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let start = Instant::now();
        let (mut busy, mut cpu) =
            (apiserver::machine_busy_seconds(), apiserver::proc_stats(pid).unwrap_or_default().cpu_seconds);
        loop {
            tokio::time::sleep(every).await;
            let (b, c) =
                (apiserver::machine_busy_seconds(), apiserver::proc_stats(pid).unwrap_or_default().cpu_seconds);
            let secs = every.as_secs_f64();
            println!(
                "# {what} +{:.0} s: {} Placed, {} Ready of {}; machine {:.2} cores, controller {:.2} cores",
                start.elapsed().as_secs_f64(),
                all_ready(&store, "Placed"),
                all_ready(&store, "Ready"),
                store.state().len(),
                (b - busy) / secs,
                (c - cpu) / secs
            );
            (busy, cpu) = (b, c);
        }
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split(' ').take(3).collect::<Vec<_>>().join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run by scripts/bench-convergence.sh"]
async fn controller_at_fleet_scale() {
    let p = Params::from_env();
    println!("# {}", p.describe());
    let started = Instant::now();
    let members = p.member_names();
    let mut names: Vec<&str> = vec!["control"];
    names.extend(members.iter().map(String::as_str));
    let fleet = Fleet::up_audited("bench", &names);
    for (i, m) in members.iter().enumerate() {
        for (pool, profile, count) in p.pools(i) {
            fleet.gpu_nodes(m, profile, count, pool, &p.region(i));
        }
    }
    println!("# harness up with nodes in {:.0} s, load {}", started.elapsed().as_secs_f64(), loadavg());
    let (rss, cores, procs) = cluster_cost(&fleet, &members[0], Duration::from_secs(10)).await;
    let (crss, ccores, _) = cluster_cost(&fleet, "control", Duration::from_secs(5)).await;
    println!(
        "# one member idle ({procs} processes, {} nodes): {rss:.0} MiB RSS, {:.2} cores; control: {crss:.0} MiB, {:.2} cores",
        p.nodes, cores, ccores
    );

    let control = fleet.client("control").await;
    fleet::setup(&fleet, &control, &p).await;
    let mut clients = vec![("control".to_string(), control.clone())];
    for m in &members {
        clients.push((m.clone(), fleet.client(m).await));
    }
    let audits = names.iter().filter_map(|n| Some((n.to_string(), fleet.audit_log(n)?))).collect();
    let servers = Servers { clients, audits, clusters_dir: fleet.dir.join("kwok/clusters") };
    let member_clients: Vec<(String, Client)> =
        servers.clients.iter().filter(|(n, _)| n != "control").cloned().collect();
    // The baseline first, on the members as they came up, before the controller starts.
    let mut windows: Vec<Window> = Vec::new();
    let base = baseline::run(&fleet, &control, &p, &member_clients, &servers, &mut windows).await;
    let victim = base.victim.clone();
    let deployments = watch(Api::<ModelDeployment>::namespaced(control.clone(), "ml")).await;
    let clusters = watch(Api::<InferenceCluster>::all(control.clone())).await;

    let (poll, concurrency) = (p.poll_seconds.to_string(), p.deployment_concurrency.to_string());
    // `ml` named as the tenants' namespace, as the e2e tests of ModelCaches do (the chart then
    // grants the Secret reads a cache may need there).
    let args = ["--poll-seconds", &poll, "--deployment-concurrency", &concurrency, "--tenant-namespaces", "ml"];
    let mut ctl = ControllerProcess::start(&fleet, "control", "bench", &args);
    let pid = ctl.pid();
    let meter = begin(&servers, pid).await;
    let clusters_ready = until(Duration::from_secs(300), || {
        clusters
            .store
            .state()
            .iter()
            .filter(|c| c.status.as_ref().is_some_and(|s| s.conditions.is_true("Ready")))
            .count()
            == members.len()
    })
    .await;
    windows.push(meter.end("start-up (every member Ready)", &servers, pid).await);

    // Convergence: apply every deployment, then wait for all Placed and all Ready.
    let meter = begin(&servers, pid).await;
    let start = Instant::now();
    let line = timeline("convergence", deployments.store.clone(), pid, Duration::from_secs(10));
    let applies = (0..p.deployments).map(|i| {
        let control = control.clone();
        let d = p.deployment(i);
        async move { harness::apply(&control, d).await }
    });
    futures_util::stream::iter(applies).buffer_unordered(8).collect::<Vec<()>>().await;
    let applied = start.elapsed();
    let timeout = Duration::from_secs(p.timeout_seconds);
    let placed =
        until(timeout, || all_ready(&deployments.store, "Placed") == p.deployments).await.map(|_| start.elapsed());
    let ready =
        until(timeout, || all_ready(&deployments.store, "Ready") == p.deployments).await.map(|_| start.elapsed());
    line.abort();
    let mut conv = meter.end("convergence (apply → all Ready)", &servers, pid).await;
    // The benchmark's own applies are not the controller's.
    if let Some(g) = conv.grown.get_mut("control") {
        let key =
            if g.contains_key("APPLY modeldeployments") { "APPLY modeldeployments" } else { "PATCH modeldeployments" };
        if let Some(v) = g.get_mut(key) {
            *v = (*v - p.deployments as f64).max(0.0);
        }
    }
    if ready.is_none() {
        fleet::report_stuck(&deployments.store.state());
    }
    windows.push(conv);
    let writes = ctl.metric_sum("flotilla_controller_status_writes_total", "ModelDeployment");
    let reconciles = ctl.metric_sum("flotilla_controller_reconciles_total", "ModelDeployment");
    let after_convergence = apiserver::proc_stats(pid).unwrap_or_default();

    // ModelCaches staged (off the member to be stopped) and Ready before the steady window.
    let others: Vec<(String, Client)> = member_clients.iter().filter(|(n, _)| *n != victim).cloned().collect();
    let caches = steady::stage_caches(&control, &others, &p).await;
    println!(
        "# caches: {} ModelCaches, {} stagings played, all Ready {}",
        caches.caches,
        caches.stagings,
        secs(caches.ready)
    );

    // Steady state: nothing Flotilla counts changes, though the inventory churns; the controller
    // should only watch (and renew its Lease).
    tokio::time::sleep(Duration::from_secs(p.settle_seconds)).await;
    let changes_before = deployments.changes.load(Ordering::Relaxed);
    let churners: Vec<(String, Client)> = member_clients.iter().take(p.churn_members).cloned().collect();
    let meter = begin(&servers, pid).await;
    let (churn, churning) = steady::churn(churners, p.pools(0)[0].2, Duration::from_secs(p.churn_seconds));
    tokio::time::sleep(Duration::from_secs(p.steady_seconds)).await;
    churning.abort();
    let name = format!(
        "steady state ({} s; {} ModelCaches, inventory churn on {} members)",
        p.steady_seconds,
        caches.caches,
        p.churn_members.min(member_clients.len())
    );
    let steady = meter.end(&name, &servers, pid).await;
    println!("# steady state: inventory churn: {}", churn.describe());
    let steady_changes = deployments.changes.load(Ordering::Relaxed) - changes_before;
    let steady_rss = apiserver::proc_stats(pid).unwrap_or_default();
    windows.push(steady);

    // A member outage: the member the baseline stopped, the one its plan gave the most replicas
    // (never the only one of its jurisdiction, so that everything it ran has somewhere to go).
    // The member running the most ready replicas now, as before the baseline, for comparison.
    let ready_on = |m: &str| -> i32 {
        deployments
            .store
            .state()
            .iter()
            .filter_map(|d| d.status.as_ref()?.placements.iter().find(|pl| pl.cluster == m).map(|pl| pl.ready))
            .sum()
    };
    let own_pick = members
        .iter()
        .enumerate()
        .filter(|(i, _)| !p.is_eu(*i) || p.eu_members() >= 2)
        .max_by_key(|(_, m)| ready_on(m))
        .map(|(_, m)| m.clone())
        .unwrap();
    println!(
        "# outage: {victim} stops ({} replicas Ready there; the most Ready now: {own_pick}, {})",
        ready_on(&victim),
        ready_on(&own_pick)
    );
    let on_victim = |d: &ModelDeployment| {
        d.status.as_ref().is_some_and(|s| s.placements.iter().any(|pl| pl.cluster == victim && pl.desired > 0))
    };
    let affected: Vec<String> =
        deployments.store.state().iter().filter(|d| on_victim(d)).map(|d| d.name_any()).collect();
    let replicas_there: i32 = deployments
        .store
        .state()
        .iter()
        .filter_map(|d| d.status.as_ref()?.placements.iter().find(|pl| pl.cluster == victim).map(|pl| pl.ready))
        .sum();
    let meter = begin(&servers, pid).await;
    let line = timeline("outage", deployments.store.clone(), pid, Duration::from_secs(5));
    fleet.stop(&victim);
    let outage_timeout = Duration::from_secs(p.timeout_seconds.min(600));
    let cluster_is =
        |cond: &str, want: bool| {
            clusters.store.state().iter().any(|c| {
                c.name_any() == victim && c.status.as_ref().is_some_and(|s| s.conditions.is_true(cond) == want)
            })
        };
    let detected = until(outage_timeout, || cluster_is("Reachable", false)).await;
    let replaced = until(outage_timeout, || {
        deployments.store.state().iter().filter(|d| affected.contains(&d.name_any())).all(|d| {
            let Some(s) = d.status.as_ref() else { return false };
            let elsewhere: i32 = s.placements.iter().filter(|pl| pl.cluster != victim).map(|pl| pl.ready).sum();
            elsewhere >= d.spec.replicas
        })
    })
    .await
    .map(|_| meter.start.elapsed());
    line.abort();
    let outage = meter.end(&format!("outage of {victim} (until re-placed)"), &servers, pid).await;
    windows.push(outage);

    let meter = begin(&servers, pid).await;
    fleet.start(&victim);
    let back = until(outage_timeout, || cluster_is("Ready", true)).await;
    let all_back = until(outage_timeout, || all_ready(&deployments.store, "Ready") == p.deployments).await;
    let recovered = back.zip(all_back).map(|(a, b)| a + b);
    windows.push(meter.end(&format!("recovery of {victim} (until all Ready)"), &servers, pid).await);
    let end = apiserver::proc_stats(pid).unwrap_or_default();
    ctl.kill();

    report::print_report(
        &p,
        &report::Report {
            applied,
            placed,
            ready,
            clusters_ready,
            writes,
            reconciles,
            after_convergence,
            steady_rss,
            end,
            steady_changes,
            victim: &victim,
            affected: affected.len(),
            replicas_there,
            detected,
            replaced,
            recovered,
            baseline: &base,
            caches: &caches,
            churn: &churn,
        },
        &windows,
    );
}
