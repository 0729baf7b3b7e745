//! What `plan --live` shows: the difference between a plan and what runs now. "Now" is each
//! live ModelDeployment's status — its replicas per (cluster, pool) as the controller last
//! placed them (and how many of those are ready), and how many it could not place. Per
//! deployment and pool: current replicas → planned, clusters added and removed, and replicas
//! newly left unplaced with every cluster's reason. Deployments whose placement would not
//! change are only counted. Pure.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use flotilla_apis::ModelDeployment;
use flotilla_placement::plan::{DeploymentPlan, Plan};
use serde::Serialize;

use crate::render::table;

/// The difference for the whole fleet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanDiff {
    /// Deployments whose placement would change, in plan order.
    pub changed: Vec<DeploymentDiff>,
    /// How many deployments would keep their placement.
    pub unchanged: usize,
}

/// How one deployment would change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentDiff {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Whether it is not live yet (only in the files).
    pub new: bool,
    /// `spec.replicas` live (0 when new).
    pub current_desired: u32,
    /// `spec.replicas` planned.
    pub planned_desired: u32,
    /// One entry per (cluster, pool) that has or gets replicas, by cluster and pool.
    pub pools: Vec<PoolChange>,
    /// Replicas unplaced now (live status).
    pub current_unplaced: u32,
    /// Replicas the plan leaves unplaced.
    pub planned_unplaced: u32,
    /// Every cluster's reason, when the plan leaves more replicas unplaced than now.
    pub reasons: Vec<Reason>,
}

/// Replicas in one pool of one cluster, now and planned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolChange {
    /// The InferenceCluster.
    pub cluster: String,
    /// The pool.
    pub pool: String,
    /// The class the plan uses there (the live one's when the plan drops the pool).
    pub class: String,
    /// Replicas there now (where the controller placed them).
    pub current: u32,
    /// Of those, replicas the member reports ready (a draining pool may have ready replicas
    /// and none placed).
    pub ready: u32,
    /// Replicas the plan puts there.
    pub planned: u32,
    /// `added` / `removed` when the whole cluster gains its first / loses its last replica.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_change: Option<&'static str>,
}

/// A cluster's reason for not taking more replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reason {
    /// The InferenceCluster.
    pub cluster: String,
    /// Machine-readable reason.
    pub reason: String,
    /// The numbers behind it.
    pub message: String,
}

type Replicas = BTreeMap<(String, String), (String, u32)>;

/// Placed and ready replicas per (cluster, pool) in a live deployment's status.
fn current_of(md: &ModelDeployment) -> (Replicas, BTreeMap<(String, String), u32>) {
    let mut placed = Replicas::new();
    let mut ready = BTreeMap::new();
    for p in md.status.iter().flat_map(|s| &s.placements) {
        let key = (p.cluster.clone(), p.pool.clone());
        let e = placed.entry(key.clone()).or_insert_with(|| (p.class.clone(), 0));
        e.1 += p.desired.max(0) as u32;
        *ready.entry(key).or_insert(0) += p.ready.max(0) as u32;
    }
    (placed, ready)
}

fn planned_of(plan: &DeploymentPlan) -> Replicas {
    let mut out = Replicas::new();
    for a in &plan.assignments {
        let e = out.entry((a.cluster.clone(), a.pool.clone())).or_insert_with(|| (a.class.clone(), 0));
        e.1 += a.replicas;
    }
    out
}

fn cluster_total(r: &Replicas, cluster: &str) -> u32 {
    r.iter().filter(|((c, _), _)| c == cluster).map(|(_, (_, n))| n).sum()
}

/// The difference between `plan` and the `live` deployments' status.
pub fn diff(live: &[ModelDeployment], plan: &Plan) -> PlanDiff {
    let mut out = PlanDiff::default();
    for d in &plan.deployments {
        let md = live.iter().find(|m| {
            m.metadata.namespace.as_deref().unwrap_or("default") == d.namespace
                && m.metadata.name.as_deref() == Some(d.name.as_str())
        });
        let (current, ready) = md.map(current_of).unwrap_or_default();
        let planned = planned_of(d);
        let mut keys: Vec<&(String, String)> = current.keys().chain(planned.keys()).collect();
        keys.sort();
        keys.dedup();
        let pools: Vec<PoolChange> = keys
            .into_iter()
            .map(|k| {
                let (now_class, now) = current.get(k).cloned().unwrap_or_default();
                let (plan_class, then) = planned.get(k).cloned().unwrap_or_default();
                let (before, after) = (cluster_total(&current, &k.0), cluster_total(&planned, &k.0));
                let cluster_change = match (before, after) {
                    (0, a) if a > 0 => Some("added"),
                    (b, 0) if b > 0 => Some("removed"),
                    _ => None,
                };
                PoolChange {
                    cluster: k.0.clone(),
                    pool: k.1.clone(),
                    class: if plan_class.is_empty() { now_class } else { plan_class },
                    current: now,
                    ready: ready.get(k).copied().unwrap_or(0),
                    planned: then,
                    cluster_change,
                }
            })
            .collect();
        let current_unplaced =
            md.and_then(|m| m.status.as_ref()?.unplaced.as_ref()).map_or(0, |u| u.replicas.max(0) as u32);
        let current_desired = md.map_or(0, |m| m.spec.replicas.max(0) as u32);
        let changed = md.is_none()
            || current_desired != d.desired
            || current_unplaced != d.unplaced
            || pools.iter().any(|p| p.current != p.planned);
        if !changed {
            out.unchanged += 1;
            continue;
        }
        let reasons = if d.unplaced > current_unplaced {
            d.rejections
                .iter()
                .map(|r| Reason {
                    cluster: r.cluster.clone(),
                    reason: r.reason.to_string(),
                    message: r.message.clone(),
                })
                .collect()
        } else {
            Vec::new()
        };
        out.changed.push(DeploymentDiff {
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            new: md.is_none(),
            current_desired,
            planned_desired: d.desired,
            pools,
            current_unplaced,
            planned_unplaced: d.unplaced,
            reasons,
        });
    }
    out
}

fn change(current: u32, planned: u32) -> String {
    match planned.cmp(&current) {
        std::cmp::Ordering::Greater => format!("+{}", planned - current),
        std::cmp::Ordering::Less => format!("-{}", current - planned),
        std::cmp::Ordering::Equal => "=".to_string(),
    }
}

/// The difference as a table, the newly unplaced replicas with reasons, and a summary line.
pub fn render(diff: &PlanDiff) -> String {
    let mut out = String::new();
    if diff.changed.is_empty() {
        let _ = writeln!(out, "No changes: all {} deployment(s) keep their placement.", diff.unchanged);
        return out;
    }
    for d in &diff.changed {
        let replicas = if d.new {
            format!("new, {} replica(s)", d.planned_desired)
        } else if d.current_desired != d.planned_desired {
            format!("replicas {} -> {}", d.current_desired, d.planned_desired)
        } else {
            format!("replicas {}", d.planned_desired)
        };
        let _ = writeln!(out, "{}/{}: {replicas}", d.namespace, d.name);
        let mut rows =
            vec![["  CLUSTER", "POOL", "CLASS", "CURRENT", "READY", "PLANNED", "CHANGE"].map(String::from).to_vec()];
        for p in &d.pools {
            let mut what = change(p.current, p.planned);
            if let Some(c) = p.cluster_change {
                let _ = write!(what, " (cluster {c})");
            }
            rows.push(vec![
                format!("  {}", p.cluster),
                p.pool.clone(),
                p.class.clone(),
                p.current.to_string(),
                p.ready.to_string(),
                p.planned.to_string(),
                what,
            ]);
        }
        if d.current_unplaced > 0 || d.planned_unplaced > 0 {
            rows.push(vec![
                "  (unplaced)".into(),
                "-".into(),
                "-".into(),
                d.current_unplaced.to_string(),
                "-".into(),
                d.planned_unplaced.to_string(),
                change(d.current_unplaced, d.planned_unplaced),
            ]);
        }
        out.push_str(&table(&rows));
    }
    let newly: Vec<&DeploymentDiff> = diff.changed.iter().filter(|d| d.planned_unplaced > d.current_unplaced).collect();
    if !newly.is_empty() {
        out.push_str("\nNEWLY UNPLACED\n");
        for d in &newly {
            let _ = writeln!(
                out,
                "{}/{}: {} of {} replicas unplaced (now {})",
                d.namespace, d.name, d.planned_unplaced, d.planned_desired, d.current_unplaced
            );
            let rows: Vec<Vec<String>> = d
                .reasons
                .iter()
                .map(|r| vec![format!("  {}", r.cluster), r.reason.clone(), r.message.clone()])
                .collect();
            out.push_str(&table(&rows));
        }
    }
    let pools = diff.changed.iter().flat_map(|d| &d.pools);
    let added: u32 = pools.clone().map(|p| p.planned.saturating_sub(p.current)).sum();
    let removed: u32 = pools.map(|p| p.current.saturating_sub(p.planned)).sum();
    let newly_unplaced: u32 = newly.iter().map(|d| d.planned_unplaced - d.current_unplaced).sum();
    let _ = writeln!(
        out,
        "\n{} deployment(s) change, {} unchanged: {added} replica(s) added, {removed} removed, {newly_unplaced} newly unplaced",
        diff.changed.len(),
        diff.unchanged
    );
    out
}
