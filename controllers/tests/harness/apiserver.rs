//! What the harness reads from outside the controller: each API server's own count of the
//! requests it served (`apiserver_request_total` from its `/metrics`, summed by verb and
//! resource, and the difference between two readings), and a process's CPU seconds and memory
//! from `/proc` (the controller's, and every component of one harness cluster). The API server
//! counts every client, not only Flotilla: callers pick the resources only Flotilla uses.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;

use kube::Client;

/// Request counts keyed `"<VERB> <resource>[/<subresource>]"` (non-resource URLs such as
/// `/version` and `/metrics` have an empty resource: `"GET "`).
pub type Requests = BTreeMap<String, f64>;

/// Verbs that change something (server-side apply counts as `APPLY`).
pub const WRITE_VERBS: [&str; 6] = ["POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"];

/// The member resources Flotilla itself creates and writes (never a subresource: the member's
/// own controllers write `deployments/status`).
pub const MEMBER_WRITTEN: [&str; 9] = [
    "deployments",
    "services",
    "poddisruptionbudgets",
    "leaderworkersets",
    "resourceclaimtemplates",
    "namespaces",
    "jobs",
    "persistentvolumeclaims",
    "secrets",
];

/// The member resources Flotilla only reads (inventory watches); the member's own
/// controllers and kwok write them, so only their LISTs and WATCHes are telling.
pub const MEMBER_READ: [&str; 4] = ["nodes", "pods", "resourceslices", "resourceclaims"];

/// The control-cluster resources only Flotilla (and the benchmark's own applies and watch)
/// touch; leases are counted apart, as the control cluster's controller-manager and scheduler
/// renew theirs there too.
pub const CONTROL_FLOTILLA: [&str; 7] =
    ["modeldeployments", "inferenceclusters", "inferenceclasses", "modelcaches", "capacityclaims", "secrets", "events"];

/// The API server's own count of requests, from its `/metrics`. `None` when it does not answer.
pub async fn apiserver_requests(client: &Client) -> Option<Requests> {
    let req = axum::http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.ok()?;
    let mut out = Requests::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let labels = labels.trim_start_matches("apiserver_request_total{").trim_end_matches('}');
        let label: BTreeMap<&str, &str> = labels
            .split("\",")
            .filter_map(|kv| kv.split_once("=\""))
            .map(|(k, v)| (k, v.trim_end_matches('"')))
            .collect();
        let resource = match label.get("subresource").copied().unwrap_or("") {
            "" => label.get("resource").copied().unwrap_or("").to_string(),
            sub => format!("{}/{sub}", label.get("resource").copied().unwrap_or("")),
        };
        let key = format!("{} {resource}", label.get("verb").copied().unwrap_or(""));
        *out.entry(key).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    Some(out)
}

/// The WATCH requests open now on the API server, by resource (its `apiserver_longrunning_requests`
/// gauge, summed over scopes). `None` when it does not answer.
pub async fn apiserver_watches(client: &Client) -> Option<BTreeMap<String, f64>> {
    let req = axum::http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.ok()?;
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_longrunning_requests{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        if !labels.contains("verb=\"WATCH\"") {
            continue;
        }
        let Some(resource) = labels.split("resource=\"").nth(1).and_then(|r| r.split('"').next()) else { continue };
        *out.entry(resource.to_string()).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    Some(out)
}

/// What changed between two readings (only what grew). An API server restarted in between
/// starts from zero: what it counted since then is what grew.
pub fn grown(before: &Requests, after: &Requests) -> Requests {
    let restarted = after.iter().any(|(k, v)| *v < before.get(k).copied().unwrap_or(0.0));
    after
        .iter()
        .map(|(k, v)| (k.clone(), if restarted { *v } else { v - before.get(k).copied().unwrap_or(0.0) }))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

/// Splits a key into (verb, resource, subresource).
fn parts(key: &str) -> (&str, &str, &str) {
    let (verb, rest) = key.split_once(' ').unwrap_or((key, ""));
    let (resource, sub) = rest.split_once('/').unwrap_or((rest, ""));
    (verb, resource, sub)
}

/// Of a difference, the requests on the main resource (no subresource) of `resources`.
pub fn on_resources(grown: &Requests, resources: &[&str]) -> Requests {
    grown
        .iter()
        .filter(|(k, _)| {
            let (_, r, sub) = parts(k);
            sub.is_empty() && resources.contains(&r)
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// Of a difference, the requests on `resources` and any of their subresources (on the control
/// cluster, `modeldeployments/status` is Flotilla's too).
pub fn on_resources_and_subresources(grown: &Requests, resources: &[&str]) -> Requests {
    grown.iter().filter(|(k, _)| resources.contains(&parts(k).1)).map(|(k, v)| (k.clone(), *v)).collect()
}

/// Of a difference, the LISTs and writes (no WATCH, no GET).
pub fn lists_and_writes(grown: &Requests) -> Requests {
    grown
        .iter()
        .filter(|(k, _)| {
            let (verb, _, _) = parts(k);
            verb == "LIST" || WRITE_VERBS.contains(&verb)
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// The member resources a ModelDeployment makes (the first six of [`MEMBER_WRITTEN`]; the
/// other three are the ModelCache's, which the periodic sweep lists every pass).
pub const MEMBER_DEPLOYMENT_KINDS: [&str; 6] =
    ["deployments", "services", "poddisruptionbudgets", "leaderworkersets", "resourceclaimtemplates", "namespaces"];

/// The LISTs and writes of the resources a ModelDeployment makes in a member.
pub fn flotilla_lists_and_writes(grown: &Requests) -> Requests {
    lists_and_writes(&on_resources(grown, &MEMBER_DEPLOYMENT_KINDS))
}

/// The requests a member API server served Flotilla: every verb on what it writes, LIST and
/// WATCH on what it only reads (the member's own components write those).
pub fn member_flotilla(grown: &Requests) -> Requests {
    let mut out = on_resources(grown, &MEMBER_WRITTEN);
    out.extend(on_resources(grown, &MEMBER_READ).into_iter().filter(|(k, _)| {
        let (verb, _, _) = parts(k);
        verb == "LIST" || verb == "WATCH"
    }));
    out
}

/// Summed by verb.
pub fn by_verb(requests: &Requests) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (k, v) in requests {
        *out.entry(parts(k).0.to_string()).or_default() += v;
    }
    out
}

/// `LIST 3, WATCH 12, APPLY 40` (verbs in a fixed order, zeros left out), or `—`.
pub fn verbs_text(requests: &Requests) -> String {
    let v = by_verb(requests);
    let order = ["LIST", "WATCH", "GET", "APPLY", "PATCH", "PUT", "POST", "DELETE", "DELETECOLLECTION"];
    let text: Vec<String> = order.iter().filter_map(|verb| v.get(*verb).map(|n| format!("{verb} {n:.0}"))).collect();
    if text.is_empty() { "—".to_string() } else { text.join(", ") }
}

/// CPU seconds (user + system) and memory of one process, from `/proc/<pid>/{stat,status}`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcStats {
    pub cpu_seconds: f64,
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
}

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`; 100 on Linux).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// `None` when the process is gone.
pub fn proc_stats(pid: u32) -> Option<ProcStats> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start at field 3 (state).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Some(ProcStats {
        cpu_seconds: ticks / clock_ticks(),
        rss_mib: kib("VmRSS:") / 1024.0,
        peak_rss_mib: kib("VmHWM:") / 1024.0,
    })
}

/// Every process whose command line names a path under `dir` (the harness starts each
/// cluster's etcd, kube-apiserver, controller-manager, scheduler and kwok with their files
/// under the cluster's own directory). A path *under* it: `clusters/m1` is not `clusters/m10`.
pub fn processes_under(dir: &Path) -> Vec<u32> {
    command_lines_under(dir).into_iter().map(|(pid, _, _)| pid).collect()
}

/// [`processes_under`] with each one's command line (arguments joined by NUL) and the rest of
/// it after `dir`'s path.
fn command_lines_under(dir: &Path) -> Vec<(u32, String, String)> {
    let needle = format!("{}/", dir.to_string_lossy().trim_end_matches('/'));
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).ok()?).to_string();
            let after = cmdline.split_once(&needle)?.1.to_string();
            Some((pid, cmdline, after))
        })
        .collect()
}

/// A harness process: the program it runs (the file name of its first argument:
/// `kube-apiserver`, `etcd`, `kwok`, …) and the cluster whose directory its command line names.
pub type Program = (String, String);

/// CPU seconds so far of every process under `dir` ([`processes_under`]; `dir` holds one
/// directory per cluster), by pid, with its [`Program`].
pub fn cpu_by_process(dir: &Path) -> BTreeMap<u32, (Program, f64)> {
    command_lines_under(dir)
        .into_iter()
        .filter_map(|(pid, cmdline, after)| {
            let argv0 = cmdline.split('\0').next()?;
            let program = argv0.rsplit('/').next().unwrap_or(argv0).to_string();
            let cluster = after.split(['/', '\0']).next()?.to_string();
            Some((pid, ((program, cluster), proc_stats(pid)?.cpu_seconds)))
        })
        .collect()
}

/// CPU seconds each [`Program`] used between two readings of [`cpu_by_process`]. A process
/// started in between counts from zero; one gone by the second reading counts nothing for the
/// interval (an undercount, e.g. of a member stopped in it).
pub fn cpu_grown(
    before: &BTreeMap<u32, (Program, f64)>,
    after: &BTreeMap<u32, (Program, f64)>,
) -> BTreeMap<Program, f64> {
    let mut out = BTreeMap::new();
    for (pid, (program, cpu)) in after {
        let was = before.get(pid).filter(|(p, _)| p == program).map_or(0.0, |(_, c)| *c);
        *out.entry(program.clone()).or_default() += (cpu - was).max(0.0);
    }
    out
}

/// CPU seconds the whole machine has spent busy (every core, `/proc/stat`: user, nice, system,
/// irq and softirq; not idle, iowait or time stolen by the hypervisor).
pub fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else { return 0.0 };
    let ticks: Vec<f64> = cpu.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
    [0, 1, 2, 5, 6].iter().filter_map(|i| ticks.get(*i)).sum::<f64>() / clock_ticks()
}

/// Summed over processes (peak is the sum of each one's peak).
pub fn sum_stats(pids: &[u32]) -> ProcStats {
    pids.iter().filter_map(|p| proc_stats(*p)).fold(ProcStats::default(), |a, s| ProcStats {
        cpu_seconds: a.cpu_seconds + s.cpu_seconds,
        rss_mib: a.rss_mib + s.rss_mib,
        peak_rss_mib: a.peak_rss_mib + s.peak_rss_mib,
    })
}

/// The requests of one client in an API server's audit log (`FLOTILLA_E2E_AUDIT`, policy
/// `tests/e2e/harness/audit-policy.yaml`), told apart by its `User-Agent`: from byte `from` of
/// the log to its end, keyed like [`Requests`] (`list` → `LIST`, `create` → `POST`, `update` →
/// `PUT`, `patch` and server-side apply → `PATCH`). A missing log reads as empty. The policy leaves out GETs, WATCHes and Leases, so what is counted is the
/// LISTs and writes.
pub fn audited(log: &Path, agent: &str, from: u64) -> Requests {
    use std::io::{BufRead, Seek};
    let mut out = Requests::new();
    let Ok(mut file) = std::fs::File::open(log) else { return out };
    if file.seek(std::io::SeekFrom::Start(from)).is_err() {
        return out;
    }
    let mut reader = std::io::BufReader::new(file);
    let mut line = String::new();
    // Only whole lines: one the API server is still writing belongs to the next window.
    while reader.read_line(&mut line).unwrap_or(0) > 0 && line.ends_with('\n') {
        if let Ok(e) = serde_json::from_str::<serde_json::Value>(&line)
            && e["stage"] == "ResponseComplete"
            && e["userAgent"].as_str().is_some_and(|a| a.starts_with(agent))
        {
            let verb = match e["verb"].as_str().unwrap_or("") {
                "create" => "POST".to_string(),
                "update" => "PUT".to_string(),
                v => v.to_uppercase(),
            };
            let object = &e["objectRef"];
            let resource = match (object["resource"].as_str(), object["subresource"].as_str()) {
                (Some(r), Some(s)) => format!("{r}/{s}"),
                (Some(r), None) => r.to_string(),
                _ => String::new(),
            };
            *out.entry(format!("{verb} {resource}")).or_default() += 1.0;
        }
        line.clear();
    }
    out
}

/// Where an audit log ends now (0 when there is none yet).
pub fn audit_end(log: &Path) -> u64 {
    std::fs::metadata(log).map(|m| m.len()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(pairs: &[(&str, f64)]) -> Requests {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn differences_pick_flotilla_resources_and_verbs() {
        let before = reading(&[("LIST deployments", 2.0), ("WATCH pods", 1.0), ("PATCH pods/status", 5.0)]);
        let after = reading(&[
            ("LIST deployments", 3.0),
            ("WATCH pods", 2.0),
            ("PATCH pods/status", 9.0),
            ("POST pods", 4.0),
            ("APPLY deployments", 1.0),
        ]);
        let g = grown(&before, &after);
        assert_eq!(g["PATCH pods/status"], 4.0);
        let f = member_flotilla(&g);
        assert_eq!(on_resources_and_subresources(&g, &["pods"]).len(), 3, "pods, pods/status");
        assert_eq!(f, reading(&[("LIST deployments", 1.0), ("WATCH pods", 1.0), ("APPLY deployments", 1.0)]));
        assert_eq!(flotilla_lists_and_writes(&g), reading(&[("LIST deployments", 1.0), ("APPLY deployments", 1.0)]));
        assert_eq!(verbs_text(&f), "LIST 1, WATCH 1, APPLY 1");
        assert_eq!(verbs_text(&Requests::new()), "—");
    }

    #[test]
    fn a_restarted_server_counts_from_zero() {
        let before = reading(&[("LIST deployments", 10.0)]);
        let after = reading(&[("LIST deployments", 2.0), ("WATCH pods", 3.0)]);
        assert_eq!(grown(&before, &after), after);
    }

    #[test]
    fn this_process_has_cpu_and_memory() {
        let s = proc_stats(std::process::id()).unwrap();
        assert!(s.rss_mib > 0.0 && s.peak_rss_mib >= s.rss_mib);
    }
}
