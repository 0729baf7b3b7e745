//! `fleetctl get` tables, from objects as the control cluster returns them: one row per object
//! with its readiness, the columns `kubectl get` shows (the CRDs' printer columns) and a
//! CONDITIONS column (`Ready=False(ReplicasNotReady)`, the ready condition first, then each
//! condition that is not as it should be). `-o wide` adds columns and, under the table, every
//! condition with its reason, age and message. Pure: `now` is passed in, so output is stable.

use std::fmt::Write as _;

use flotilla_apis::common::format_price_micros;
use flotilla_apis::constants::condition;
use flotilla_apis::{CapacityClaim, CapacityType, InferenceClass, InferenceCluster, ModelCache, ModelDeployment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use crate::render::table;

/// How to draw a table.
#[derive(Clone, Copy, Debug)]
pub struct TableOptions {
    /// More columns, and every condition's message under the table.
    pub wide: bool,
    /// A NAMESPACE column (all namespaces).
    pub namespace_column: bool,
    /// The time ages are measured to.
    pub now: Timestamp,
}

/// Conditions whose `True` is bad news (the others are good news when `True`).
fn negative(type_: &str) -> bool {
    matches!(type_, condition::DEGRADED | condition::WAITING_FOR_CACHE | condition::PROVISIONING)
}

/// Whether a condition is as it should be.
pub fn healthy(c: &Condition) -> bool {
    if negative(&c.type_) { c.status == "False" } else { c.status == "True" }
}

/// The CONDITIONS column: `Ready` first, then every condition that is not healthy (every
/// condition when `all`), each as `Type=Status(Reason)`.
pub fn conditions_column(conditions: &[Condition], all: bool) -> String {
    let ready = conditions.iter().filter(|c| c.type_ == condition::READY);
    let rest = conditions.iter().filter(|c| c.type_ != condition::READY && (all || !healthy(c)));
    let cells: Vec<String> = ready.chain(rest).map(|c| format!("{}={}({})", c.type_, c.status, c.reason)).collect();
    if cells.is_empty() { "-".to_string() } else { cells.join(", ") }
}

/// A duration as `kubectl get` prints ages: `42s`, `5m12s`, `47m`, `3h15m`, `20h`, `3d4h`, `12d`.
pub fn human_age(seconds: i64) -> String {
    let s = seconds.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86_400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        format!("{m}m{}s", s % 60)
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        format!("{h}h{}m", m % 60)
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        format!("{d}d{}h", h % 24)
    } else if d < 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

fn age(time: Option<&Time>, now: Timestamp) -> String {
    time.map_or("-".to_string(), |t| human_age(now.as_second() - t.0.as_second()))
}

fn ready_status(conditions: &[Condition]) -> String {
    conditions.iter().find(|c| c.type_ == condition::READY).map_or("Unknown".to_string(), |c| c.status.clone())
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or("-".to_string(), |v| v.to_string())
}

/// One object's row start (namespace, name) and the facts the common columns need.
struct Row<'a> {
    meta: &'a ObjectMeta,
    conditions: &'a [Condition],
    cells: Vec<String>,
    wide: Vec<String>,
}

fn draw(header: &[&str], wide_header: &[&str], rows: Vec<Row<'_>>, opts: &TableOptions) -> String {
    let mut head: Vec<String> = Vec::new();
    if opts.namespace_column {
        head.push("NAMESPACE".into());
    }
    head.push("NAME".into());
    head.extend(header.iter().map(|h| h.to_string()));
    if opts.wide {
        head.extend(wide_header.iter().map(|h| h.to_string()));
    }
    head.extend(["AGE".to_string(), "CONDITIONS".to_string()]);
    let mut lines = vec![head];
    for r in &rows {
        let mut line: Vec<String> = Vec::new();
        if opts.namespace_column {
            line.push(opt(r.meta.namespace.as_deref()));
        }
        line.push(opt(r.meta.name.as_deref()));
        line.extend(r.cells.iter().cloned());
        if opts.wide {
            line.extend(r.wide.iter().cloned());
        }
        line.push(age(r.meta.creation_timestamp.as_ref(), opts.now));
        line.push(conditions_column(r.conditions, opts.wide));
        lines.push(line);
    }
    let mut out = table(&lines);
    if opts.wide {
        out.push_str(&details(&rows, opts));
    }
    out
}

/// Under a wide table: every object's conditions with their messages.
fn details(rows: &[Row<'_>], opts: &TableOptions) -> String {
    let mut out = String::new();
    for r in rows {
        let name = match &r.meta.namespace {
            Some(ns) => format!("{ns}/{}", r.meta.name.as_deref().unwrap_or("")),
            None => r.meta.name.clone().unwrap_or_default(),
        };
        let _ = writeln!(out, "\n{name}:");
        if r.conditions.is_empty() {
            out.push_str("  no conditions yet (the controller has not reported on it)\n");
            continue;
        }
        let mut lines = vec![["  TYPE", "STATUS", "REASON", "AGE", "MESSAGE"].map(String::from).to_vec()];
        for c in r.conditions {
            lines.push(vec![
                format!("  {}", c.type_),
                c.status.clone(),
                c.reason.clone(),
                age(Some(&c.last_transition_time), opts.now),
                c.message.clone(),
            ]);
        }
        out.push_str(&table(&lines));
    }
    out
}

/// `fleetctl get clusters`.
pub fn clusters(items: &[InferenceCluster], opts: &TableOptions) -> String {
    let rows = items
        .iter()
        .map(|c| {
            let s = c.status.as_ref();
            let conditions = s.map_or(&[][..], |s| &s.conditions.0[..]);
            let pools: Vec<String> = s
                .map(|s| s.pools.iter().map(|p| format!("{}:{}/{}", p.name, p.devices_free, p.devices_total)).collect())
                .unwrap_or_default();
            Row {
                meta: &c.metadata,
                conditions,
                cells: vec![
                    c.spec.region.clone(),
                    c.spec.jurisdiction.0.clone(),
                    ready_status(conditions),
                    opt(s.and_then(|s| s.devices_total)),
                    opt(s.and_then(|s| s.devices_free)),
                ],
                wide: vec![
                    if pools.is_empty() { "-".into() } else { pools.join(",") },
                    opt(s.and_then(|s| s.dra)),
                    opt(s.and_then(|s| s.kubernetes_version.clone())),
                    age(s.and_then(|s| s.last_heartbeat.as_ref()), opts.now),
                ],
            }
        })
        .collect();
    draw(
        &["REGION", "JURISDICTION", "READY", "DEVICES", "FREE"],
        &["POOLS(FREE/TOTAL)", "DRA", "VERSION", "HEARTBEAT"],
        rows,
        opts,
    )
}

/// `fleetctl get deployments`.
pub fn deployments(items: &[ModelDeployment], opts: &TableOptions) -> String {
    let rows = items
        .iter()
        .map(|d| {
            let s = d.status.as_ref();
            let conditions = s.map_or(&[][..], |s| &s.conditions.0[..]);
            let unplaced = s.and_then(|s| s.unplaced.as_ref()).map_or(0, |u| u.replicas);
            let generation = format!("{}/{}", opt(s.and_then(|s| s.observed_generation)), opt(d.metadata.generation));
            Row {
                meta: &d.metadata,
                conditions,
                cells: vec![
                    d.spec.model.name.clone(),
                    d.spec.replicas.to_string(),
                    format!("{}/{}", s.map_or(0, |s| s.ready_replicas), d.spec.replicas),
                    opt(s.and_then(|s| s.clusters.clone()).filter(|c| !c.is_empty())),
                ],
                wide: vec![s.map_or(0, |s| s.replicas).to_string(), unplaced.to_string(), generation],
            }
        })
        .collect();
    let mut out = draw(
        &["MODEL", "DESIRED", "READY", "CLUSTERS(READY/DESIRED)"],
        &["PLACED", "UNPLACED", "GENERATION(OBSERVED/SPEC)"],
        rows,
        opts,
    );
    if opts.wide {
        for d in items {
            let Some(u) = d.status.as_ref().and_then(|s| s.unplaced.as_ref()).filter(|u| u.replicas > 0) else {
                continue;
            };
            let _ = writeln!(
                out,
                "\n{}/{}: {} replica(s) unplaced",
                d.metadata.namespace.as_deref().unwrap_or(""),
                d.metadata.name.as_deref().unwrap_or(""),
                u.replicas
            );
            let lines: Vec<Vec<String>> = u
                .reasons
                .iter()
                .map(|r| vec![format!("  {}", r.cluster), r.reason.clone(), r.message.clone()])
                .collect();
            out.push_str(&table(&lines));
        }
    }
    out
}

/// `fleetctl get caches`.
pub fn caches(items: &[ModelCache], opts: &TableOptions) -> String {
    let rows = items
        .iter()
        .map(|c| {
            let s = c.status.as_ref();
            let conditions = s.map_or(&[][..], |s| &s.conditions.0[..]);
            let phases: Vec<String> = s
                .map(|s| s.clusters.iter().map(|p| format!("{}:{:?}", p.cluster, p.phase)).collect())
                .unwrap_or_default();
            Row {
                meta: &c.metadata,
                conditions,
                cells: vec![
                    c.spec.source.clone(),
                    c.spec.size.0.clone(),
                    ready_status(conditions),
                    opt(s.and_then(|s| s.summary.clone())),
                ],
                wide: vec![opt(c.spec.revision.clone()), if phases.is_empty() { "-".into() } else { phases.join(",") }],
            }
        })
        .collect();
    draw(&["SOURCE", "SIZE", "READY", "CLUSTERS"], &["REVISION", "PHASES"], rows, opts)
}

/// `fleetctl get claims`.
pub fn claims(items: &[CapacityClaim], opts: &TableOptions) -> String {
    let rows = items
        .iter()
        .map(|c| {
            let s = c.status.as_ref();
            let conditions = s.map_or(&[][..], |s| &s.conditions.0[..]);
            let fulfilled = conditions.iter().find(|c| c.type_ == condition::FULFILLED);
            let allocations: Vec<String> = s
                .map(|s| s.allocations.iter().map(|a| format!("{}/{}:{}", a.cluster, a.pool, a.nodes)).collect())
                .unwrap_or_default();
            let last = s.and_then(|s| s.attempts.last()).map(|a| format!("{} {} {}", a.region, a.class, a.result));
            Row {
                meta: &c.metadata,
                conditions,
                cells: vec![
                    c.spec.pod_sets.iter().map(|p| p.count * p.devices_per_pod).sum::<i32>().to_string(),
                    s.map_or(0, |s| s.devices_obtained).to_string(),
                    fulfilled.map_or("Unknown".to_string(), |f| f.status.clone()),
                ],
                wide: vec![if allocations.is_empty() { "-".into() } else { allocations.join(",") }, opt(last)],
            }
        })
        .collect();
    draw(&["DEVICES", "OBTAINED", "FULFILLED"], &["ALLOCATIONS(NODES)", "LAST ATTEMPT"], rows, opts)
}

/// `fleetctl get classes`.
pub fn classes(items: &[InferenceClass], opts: &TableOptions) -> String {
    let price =
        |c: &InferenceClass, t: CapacityType| opt(c.spec.price_per_node_hour.micros(t).map(format_price_micros));
    let rows = items
        .iter()
        .map(|c| {
            let s = c.status.as_ref();
            let conditions = s.map_or(&[][..], |s| &s.conditions.0[..]);
            let instances = c.spec.provisioning.aws.as_ref().map(|a| a.instance_types.join(","));
            Row {
                meta: &c.metadata,
                conditions,
                cells: vec![
                    c.spec.device.driver.clone(),
                    c.spec.devices_per_node.to_string(),
                    price(c, CapacityType::OnDemand),
                    opt(s.and_then(|s| s.fleet_devices)),
                    ready_status(conditions),
                ],
                wide: vec![price(c, CapacityType::Reserved), price(c, CapacityType::Spot), opt(instances)],
            }
        })
        .collect();
    draw(
        &["DRIVER", "DEVICES/NODE", "ON-DEMAND$/H", "FLEET-DEVICES", "READY"],
        &["RESERVED$/H", "SPOT$/H", "AWS-INSTANCES"],
        rows,
        opts,
    )
}
