//! The benchmark's Markdown: the headline row, the ratio row (Flotilla against the baseline of
//! the same objects applied directly, `baseline.rs`), the requests of every window, where the
//! machine's cores went, the outage, and the steady window's LISTs and writes per minute per
//! API server (`steady.rs`). Rows start with `| ` (what `scripts/bench-convergence.sh` prints
//! of the log), everything else with `# `.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::baseline::Baseline;
use crate::fleet::Params;
use crate::harness::apiserver::{self, CONTROL_FLOTILLA, ProcStats, Requests};
use crate::steady::{self, Caches, Churn};
use crate::{Window, loadavg, secs};

/// The requests of a window Flotilla made, per server: on the control cluster its own kinds
/// (plus leases apart), on a member what `apiserver::member_flotilla` keeps.
fn flotilla_part(server: &str, grown: &Requests) -> Requests {
    if server == "control" {
        apiserver::on_resources_and_subresources(grown, &CONTROL_FLOTILLA)
    } else {
        apiserver::member_flotilla(grown)
    }
}

fn sum(maps: impl Iterator<Item = Requests>) -> Requests {
    let mut out = Requests::new();
    for m in maps {
        for (k, v) in m {
            *out.entry(k).or_default() += v;
        }
    }
    out
}

/// `| window | took | controller CPU | control | control leases | members (sum) | LISTs + writes, busiest member | by user agent |`
fn window_row(w: &Window) -> String {
    let control = w.grown.get("control").map(|g| flotilla_part("control", g)).unwrap_or_default();
    let leases = w.grown.get("control").map(|g| apiserver::on_resources(g, &["leases"])).unwrap_or_default();
    let members = w.grown.iter().filter(|(n, _)| *n != "control");
    let member_sum = sum(members.clone().map(|(n, g)| flotilla_part(n, g)));
    let busiest = members
        .map(|(n, g)| (n, apiserver::lists_and_writes(&flotilla_part(n, g))))
        .max_by(|a, b| a.1.values().sum::<f64>().total_cmp(&b.1.values().sum::<f64>()));
    let busiest = busiest.map_or("—".to_string(), |(n, g)| format!("{n}: {}", apiserver::verbs_text(&g)));
    let control_audited = w.audited.get("control").cloned().unwrap_or_default();
    let members_audited = sum(w.audited.iter().filter(|(n, _)| *n != "control").map(|(_, g)| g.clone()));
    format!(
        "| {} | {:.1} s | {:.1} s | {} | {} | {} | {} | control: {}; members: {} |",
        w.name,
        w.took.as_secs_f64(),
        w.cpu,
        apiserver::verbs_text(&control),
        apiserver::verbs_text(&leases),
        apiserver::verbs_text(&member_sum),
        busiest,
        apiserver::verbs_text(&control_audited),
        apiserver::verbs_text(&members_audited),
    )
}

/// The harness's programs, in the order of [`cores_row`]'s columns.
const PROGRAMS: [&str; 5] = ["kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok-controller"];

fn cores_header() -> String {
    format!(
        "| window | took | machine busy | {} | other harness | Flotilla's controller | benchmark | rest of the machine |",
        PROGRAMS.map(|p| format!("{p} (all clusters)")).join(" | ")
    )
}

/// `| window | took | machine busy | per program … | controller | benchmark | rest |`: CPU seconds,
/// with the machine's busy time also as cores (busy seconds over the window).
fn cores_row(w: &Window) -> String {
    let c = &w.cores;
    let of = |program: &str| c.harness.iter().filter(|((p, _), _)| p == program).map(|(_, s)| s).sum::<f64>();
    let known: f64 = PROGRAMS.iter().map(|p| of(p)).sum();
    let other = c.harness.values().sum::<f64>() - known;
    let rest = c.machine - c.harness.values().sum::<f64>() - w.cpu - c.benchmark;
    let programs: Vec<String> = PROGRAMS.iter().map(|p| format!("{:.1} s", of(p))).collect();
    format!(
        "| {} | {:.1} s | {:.1} s ({:.2} cores) | {} | {:.1} s | {:.1} s | {:.1} s | {:.1} s |",
        w.name,
        w.took.as_secs_f64(),
        c.machine,
        c.machine / w.took.as_secs_f64().max(0.001),
        programs.join(" | "),
        other,
        w.cpu,
        c.benchmark,
        rest.max(0.0),
    )
}

/// Every LIST and write of Flotilla's resources, per server and resource, and each cluster's
/// CPU seconds by program (for the log).
fn detail(w: &Window) {
    let mut clusters: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for ((program, cluster), cpu) in &w.cores.harness {
        clusters.entry(cluster).or_default().push(format!("{program} {cpu:.1}"));
    }
    for (cluster, programs) in clusters {
        println!("#   {}: {cluster}: CPU seconds: {}", w.name, programs.join(", "));
    }
    for (n, g) in &w.grown {
        let lw = apiserver::lists_and_writes(&flotilla_part(n, g));
        if !lw.is_empty() {
            println!("#   {}: {n}: {lw:?}", w.name);
        }
    }
    for (n, g) in w.audited.iter().filter(|(_, g)| !g.is_empty()) {
        println!("#   {}: {n}: the controller's own (audit log): {g:?}", w.name);
    }
}

/// What the Flotilla phase measured, and the baseline, caches and churn beside it.
pub struct Report<'a> {
    pub applied: Duration,
    pub placed: Option<Duration>,
    pub ready: Option<Duration>,
    pub clusters_ready: Option<Duration>,
    pub writes: f64,
    pub reconciles: f64,
    pub after_convergence: ProcStats,
    pub steady_rss: ProcStats,
    pub end: ProcStats,
    pub steady_changes: usize,
    pub victim: &'a str,
    pub affected: usize,
    pub replicas_there: i32,
    pub detected: Option<Duration>,
    pub replaced: Option<Duration>,
    pub recovered: Option<Duration>,
    pub baseline: &'a Baseline,
    pub caches: &'a Caches,
    pub churn: &'a Churn,
}

pub fn print_report(p: &Params, r: &Report<'_>, windows: &[Window]) {
    println!("# load at the end: {}", loadavg());
    println!();
    println!(
        "| fleet | members Ready after start | applied | all Placed | all Ready | controller CPU, start → all Ready | peak RSS | RSS in steady state | status writes | reconciles |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| {} | {} | {:.1} s | {} | {} | {:.1} s | {:.0} MiB | {:.0} MiB | {:.0} | {:.0} |",
        p.describe_short(),
        secs(r.clusters_ready),
        r.applied.as_secs_f64(),
        secs(r.placed),
        secs(r.ready),
        r.after_convergence.cpu_seconds,
        r.end.peak_rss_mib,
        r.steady_rss.rss_mib,
        r.writes,
        r.reconciles
    );
    println!();
    let steady = windows.iter().find(|w| w.name.starts_with("steady"));
    let (busiest, per_minute) = steady.map(steady::controller_busiest).unwrap_or_else(|| ("—".into(), 0.0));
    let b = r.baseline;
    println!("{}", ratio_header());
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| {} | {} | {} | **{}** | {} | {} | **{}** | {:.1} s | {per_minute:.2} ({busiest}) |",
        p.describe_short(),
        secs(b.ready),
        secs(r.ready),
        times(r.ready, b.ready),
        secs(b.replaced),
        secs(r.replaced),
        times(r.replaced, b.replaced),
        r.after_convergence.cpu_seconds * 1000.0 / p.deployments.max(1) as f64,
    );
    println!();
    println!(
        "| baseline: the same objects applied directly | observed and solved | replicas placed | objects | applied | all Ready | member stopped | deployments there (replicas) | object sets moved | re-placed and Ready elsewhere | deleted and gone | refused writes |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| {} deployments, {} at a time | {:.1} s | {} of {} | {} | {:.1} s | {} | {} | {} ({}) | {} | {} | {} | {} |",
        p.deployments,
        p.deployment_concurrency,
        b.solved.as_secs_f64(),
        b.placed.0,
        b.placed.1,
        b.objects,
        b.applied.as_secs_f64(),
        secs(b.ready),
        b.victim,
        b.affected,
        b.replicas_there,
        b.moved,
        secs(b.replaced),
        secs(b.cleaned),
        if b.refused.0 == 0 { "0".to_string() } else { format!("{} (first: {})", b.refused.0, b.refused.1) },
    );
    println!();
    println!(
        "| window | took | controller CPU | control: Flotilla's kinds | control: leases (all holders) | members: Flotilla's (sum) | busiest member: LISTs and writes | the controller's own LISTs and writes (audit log, its User-Agent) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for w in windows {
        println!("{}", window_row(w));
    }
    println!();
    println!("{}", cores_header());
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for w in windows {
        println!("{}", cores_row(w));
    }
    println!();
    println!(
        "| member stopped | deployments there | replicas ready there | seen Unreachable | re-placed and Ready elsewhere | back: all Ready |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    println!(
        "| {} | {} | {} | {} | {} | {} |",
        r.victim,
        r.affected,
        r.replicas_there,
        secs(r.detected),
        secs(r.replaced),
        secs(r.recovered)
    );
    println!();
    if let Some(w) = steady {
        println!("{}", steady::rates_header());
        println!("| --- | --- | --- | --- | --- |");
        for row in steady::rates_rows(w) {
            println!("{row}");
        }
        println!();
    }
    println!(
        "# steady state held {} ModelCaches ({} stagings, Ready {} after applying them) and inventory churn: {}",
        r.caches.caches,
        r.caches.stagings,
        secs(r.caches.ready),
        r.churn.describe()
    );
    for w in windows {
        detail(w);
    }
    // From the audit logs when there are any (they name the client); else the API servers'
    // metrics, which count every client of the resources Flotilla uses.
    let worst = steady.map_or(0.0, |w| {
        if w.audited.is_empty() {
            w.grown
                .iter()
                .map(|(n, g)| apiserver::lists_and_writes(&flotilla_part(n, g)).values().sum::<f64>())
                .fold(0.0, f64::max)
        } else {
            w.audited.values().map(|g| g.values().sum::<f64>()).fold(0.0, f64::max)
        }
    });
    let source = if steady.is_some_and(|w| !w.audited.is_empty()) { "audit logs" } else { "metrics" };
    println!(
        "# steady state: {} ModelDeployment changes seen; at most {worst:.0} LISTs and writes of Flotilla's on one API server ({:.2} per minute; from the {source})",
        r.steady_changes,
        worst * 60.0 / p.steady_seconds.max(1) as f64
    );
    // The targets, as read from this run (a benchmark reports; it does not assert).
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    let within = |d: Option<Duration>, s: u64| d.is_some_and(|d| d <= Duration::from_secs(s));
    println!(
        "# targets: converge ≤ 60 s {}; outage re-placed ≤ 30 s {}; steady 0 LISTs and writes {}; peak RSS ≤ 512 MiB {}",
        met(within(r.ready, 60)),
        met(within(r.replaced, 30)),
        met(worst == 0.0),
        met(r.end.peak_rss_mib <= 512.0)
    );
    let at_most = |f: Option<Duration>, b: Option<Duration>| ratio(f, b).is_some_and(|x| x <= 1.25);
    println!(
        "# targets against the baseline: convergence ≤ 1.25× {}; outage re-placed ≤ 1.25× {}; steady (ModelCaches, inventory churn) 0 LISTs and writes by the controller {}",
        met(at_most(r.ready, b.ready)),
        met(at_most(r.replaced, b.replaced)),
        met(per_minute == 0.0)
    );
}

fn ratio_header() -> &'static str {
    "| fleet | baseline: apply → all Ready | Flotilla: apply → all Ready | convergence, × baseline | baseline: member stopped → re-placed and Ready elsewhere | Flotilla: the same | outage, × baseline | controller CPU per 1,000 deployments (start → all Ready) | steady with ModelCaches and inventory churn: the controller's LISTs + writes per minute, busiest API server (audit log) |"
}

fn ratio(flotilla: Option<Duration>, baseline: Option<Duration>) -> Option<f64> {
    let (f, b) = (flotilla?, baseline?);
    (b > Duration::ZERO).then(|| f.as_secs_f64() / b.as_secs_f64())
}

/// `1.37×`, or what is missing.
fn times(flotilla: Option<Duration>, baseline: Option<Duration>) -> String {
    match (flotilla, baseline) {
        (None, _) => "Flotilla not Ready".into(),
        (_, None) => "baseline not Ready".into(),
        _ => ratio(flotilla, baseline).map_or_else(|| "—".into(), |x| format!("{x:.2}×")),
    }
}
