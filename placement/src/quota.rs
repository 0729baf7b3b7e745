//! FleetQuotas in the solve. A namespace's quotas are hard limits on what its deployments hold
//! placed together, over every cluster: devices matching a limit (class, capacity type) and cost
//! per hour. The greedy pass charges each deployment's replicas as it places them (`Book`): a
//! replica that would take the namespace past a limit is refused on that candidate
//! (`Refusal::Quota`), so the deployment falls back to a candidate the limit does not count
//! (another class, another capacity type, a cheaper pool) or stays short with `QuotaExceeded`.
//! Deployments are charged in solve order — priority, then creation — so within a namespace a
//! higher priority takes the quota first, and a quota never touches another namespace.
//!
//! The improvement phase after the greedy pass keeps a move set only if every namespace it
//! touches stays within its limits ([`PhaseQuota`], checked where the phase settles moves), and
//! when it preempts, the tiers it solves again are charged with what the higher tiers hold. The
//! solve still checks the final plan ([`over`]) and, should a step (the exact mode's guide, a
//! path not covered above) have taken a namespace past a limit, falls back to the greedy pass
//! alone, which holds every limit by construction.
//!
//! For the incremental re-planner a deployment's room is an input of its step, like the free
//! devices of the pools it reads: [`Room`] notes, per limit, the most the step's checks asked of
//! it and whether one was refused ([`Probe`]), so a step is reused when its namespace's usage by
//! the other deployments is the same on every limit that refused, and on every other limit still
//! leaves room for all the step asked ([`Probe::holds`]).

use std::collections::BTreeMap;

use flotilla_apis::CapacityType;
use flotilla_apis::common::{format_price_micros, parse_price_micros};
use flotilla_apis::quota::DeviceLimit;
use serde::Serialize;

use super::held::{Held, Tentative};
use crate::devices::ReplicaShape;
use crate::plan::{DeploymentPlan, Plan, Reason};
use crate::snapshot::{DeploymentView, FleetSnapshot, QuotaView};

/// One limit of one quota.
#[derive(Clone, Debug)]
pub(crate) struct Limit {
    /// Index of the quota in `FleetSnapshot::quotas`.
    pub quota: usize,
    /// Index of the device limit in its `spec.devices`; `None`: `maxCostPerHour`.
    pub device: Option<usize>,
    /// The device limit as written (`None`: `maxCostPerHour`).
    pub spec: Option<DeviceLimit>,
    /// The limit (devices, or micro-dollars per hour).
    pub max: u64,
}

impl Limit {
    /// What one replica of `devices` devices at `price` on a pool of `class` and `capacity_type`
    /// adds to this limit.
    pub fn charge(&self, class: &str, capacity_type: CapacityType, devices: u32, price: u64) -> u64 {
        match &self.spec {
            None => price,
            Some(l) if l.counts(class, capacity_type) => u64::from(devices),
            Some(_) => 0,
        }
    }
}

/// What replicas of `devices` devices use of each of `limits`, placed as `placed` says:
/// (cluster index, pool index, replicas, price per replica).
fn charges(
    snapshot: &FleetSnapshot,
    limits: &[Limit],
    devices: u32,
    placed: impl Iterator<Item = (usize, usize, u32, u64)>,
) -> Vec<u64> {
    let mut out = vec![0u64; limits.len()];
    for (ci, pi, n, price) in placed {
        let pool = &snapshot.clusters[ci].pools[pi];
        let t = pool.capacity_type.unwrap_or(CapacityType::OnDemand);
        for (k, l) in limits.iter().enumerate() {
            out[k] += l.charge(&pool.class, t, devices, price) * u64::from(n);
        }
    }
    out
}

/// Every limit of every namespace.
pub(crate) fn limits(snapshot: &FleetSnapshot) -> BTreeMap<&str, Vec<Limit>> {
    let mut out: BTreeMap<&str, Vec<Limit>> = BTreeMap::new();
    for (qi, q) in snapshot.quotas.iter().enumerate() {
        let list = out.entry(q.namespace.as_str()).or_default();
        for (li, l) in q.spec.devices.iter().enumerate() {
            list.push(Limit { quota: qi, device: Some(li), spec: Some(l.clone()), max: u64::from(l.max) });
        }
        // An unparsable price (the schema refuses it) limits nothing rather than everything.
        if let Some(max) = q.spec.max_cost_per_hour.as_deref().and_then(parse_price_micros) {
            list.push(Limit { quota: qi, device: None, spec: None, max });
        }
    }
    out
}

/// The quotas during the improvement phase: per limited namespace, what the phase's placements
/// (`held`, by solve-order index) use of each limit.
pub(super) struct PhaseQuota {
    /// Per deployment: its namespace's index in `limits`, when it has quotas.
    ns_of: Vec<Option<usize>>,
    /// Devices per replica, per deployment.
    devices: Vec<u32>,
    limits: Vec<Vec<Limit>>,
    used: Vec<Vec<u64>>,
}

impl PhaseQuota {
    /// For `order` with its greedy placements `held`; `None` when no deployment's namespace
    /// has a quota.
    pub(super) fn new(snapshot: &FleetSnapshot, order: &[&DeploymentView], held: &[Vec<Held>]) -> Option<Self> {
        let by_ns = limits(snapshot);
        if !order.iter().any(|d| by_ns.contains_key(d.namespace.as_str())) {
            return None;
        }
        let names: Vec<&str> = by_ns.keys().copied().collect();
        let ns_of = order.iter().map(|d| names.iter().position(|n| *n == d.namespace)).collect();
        let devices = order.iter().map(|d| ReplicaShape::of(&d.spec.topology).devices()).collect();
        let limits: Vec<Vec<Limit>> = by_ns.into_values().collect();
        let used = limits.iter().map(|l| vec![0; l.len()]).collect();
        let mut q = PhaseQuota { ns_of, devices, limits, used };
        q.rebase(snapshot, held);
        Some(q)
    }

    /// What deployment `i`'s placements `h` use of each limit of its namespace (`n`).
    fn charges(&self, snapshot: &FleetSnapshot, n: usize, i: usize, h: &[Held]) -> Vec<u64> {
        charges(snapshot, &self.limits[n], self.devices[i], h.iter().map(|x| (x.cluster, x.pool, x.count, x.price)))
    }

    /// Usage recounted from `held` (after a re-solve, or an attempt undone).
    pub(super) fn rebase(&mut self, snapshot: &FleetSnapshot, held: &[Vec<Held>]) {
        let mut used: Vec<Vec<u64>> = self.limits.iter().map(|l| vec![0; l.len()]).collect();
        for (i, h) in held.iter().enumerate() {
            if let Some(n) = self.ns_of.get(i).copied().flatten() {
                for (k, v) in self.charges(snapshot, n, i, h).into_iter().enumerate() {
                    used[n][k] += v;
                }
            }
        }
        self.used = used;
    }

    /// Usage per touched namespace once `t`'s placements replace those in `held`.
    fn with(&self, snapshot: &FleetSnapshot, held: &[Vec<Held>], t: &Tentative) -> BTreeMap<usize, Vec<u64>> {
        let mut out: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for (&i, h) in &t.held {
            let Some(n) = self.ns_of.get(i).copied().flatten() else { continue };
            let now = out.entry(n).or_insert_with(|| self.used[n].clone());
            let (before, after) = (self.charges(snapshot, n, i, &held[i]), self.charges(snapshot, n, i, h));
            for k in 0..now.len() {
                now[k] = now[k] + after[k] - before[k];
            }
        }
        out
    }

    /// Whether every namespace `t` touches stays within its limits — or, already past one (a
    /// plan the phase did not make), does not use more of it.
    pub(super) fn holds(&self, snapshot: &FleetSnapshot, held: &[Vec<Held>], t: &Tentative) -> bool {
        self.with(snapshot, held, t).into_iter().all(|(n, now)| {
            self.limits[n].iter().zip(&now).zip(&self.used[n]).all(|((l, &v), &was)| v <= l.max || v <= was)
        })
    }

    /// Whether deployment `i`'s namespace has room under its quotas for one more replica on
    /// at least one of `cands` (true without quotas). A deployment short because of its quota
    /// gains nothing from moves: the phase does not spend its budget on it.
    pub(super) fn room_for_one(&self, snapshot: &FleetSnapshot, i: usize, cands: &[super::Candidate]) -> bool {
        let Some(n) = self.ns_of.get(i).copied().flatten() else { return true };
        cands.iter().any(|c| {
            let pool = &snapshot.clusters[c.cluster].pools[c.pool];
            let t = pool.capacity_type.unwrap_or(CapacityType::OnDemand);
            self.limits[n]
                .iter()
                .zip(&self.used[n])
                .all(|(l, &used)| used + l.charge(&pool.class, t, self.devices[i], c.replica_price) <= l.max)
        })
    }

    /// Takes `t`'s placements into the usage (before they replace those in `held`).
    pub(super) fn take(&mut self, snapshot: &FleetSnapshot, held: &[Vec<Held>], t: &Tentative) {
        for (n, now) in self.with(snapshot, held, t) {
            self.used[n] = now;
        }
    }
}

/// What the greedy pass has charged: per deployment (solve order), per limit of its namespace.
pub(crate) struct Book<'s> {
    snapshot: &'s FleetSnapshot,
    limits: BTreeMap<&'s str, Vec<Limit>>,
    /// Per deployment in solve order: its namespace's charges, one per limit.
    charged: Vec<Vec<u64>>,
    /// Per namespace: the sum of `charged` over its deployments.
    total: BTreeMap<&'s str, Vec<u64>>,
    namespaces: Vec<&'s str>,
}

/// The room a deployment has: its namespace's limits, each with what the other deployments of
/// the namespace hold (the deployment's own replicas are counted from its placing state).
#[derive(Clone, Debug)]
pub(crate) struct Room {
    pub limits: Vec<Limit>,
    pub others: Vec<u64>,
    /// What the checks asked of each limit (`refuses`), for the re-planner.
    probe: std::cell::RefCell<Probe>,
}

/// What a step's quota checks read of its room: per limit, the most its own usage plus one
/// more replica came to (`peak`, over the checks that charge the limit) and whether a check
/// found the limit passed (`refused`); with the room's `others` they were judged against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Probe {
    pub others: Vec<u64>,
    pub peak: Vec<u64>,
    pub refused: Vec<bool>,
}

impl Probe {
    /// Whether every check of the step answers the same against `others` (the other
    /// deployments' usage now) under `limits`: a limit that refused must read the same usage
    /// (its answer and its message depend on it); any other must still hold all the step asked.
    /// Then the step runs the same checks with the same answers: it may be reused.
    pub fn holds(&self, others: &[u64], limits: &[Limit]) -> bool {
        others.len() == self.others.len()
            && limits.len() == others.len()
            && (0..others.len()).all(|k| {
                if self.refused[k] { others[k] == self.others[k] } else { others[k] + self.peak[k] <= limits[k].max }
            })
    }
}

impl Room {
    /// The first limit one more replica would pass, with (its usage with the replica's
    /// deployment's own `own` charges, what the replica adds).
    pub fn refuses(
        &self,
        own: &[u64],
        class: &str,
        capacity_type: CapacityType,
        devices: u32,
        price: u64,
    ) -> Option<(usize, u64, u64)> {
        let mut probe = self.probe.borrow_mut();
        let mut first = None;
        // Every limit judged (not only up to the first refusal), so the probe knows each one's answer.
        for (i, l) in self.limits.iter().enumerate() {
            let add = l.charge(class, capacity_type, devices, price);
            if add == 0 {
                continue;
            }
            let mine = own.get(i).copied().unwrap_or(0) + add;
            probe.peak[i] = probe.peak[i].max(mine);
            let used = self.others[i] + own.get(i).copied().unwrap_or(0);
            if used + add > l.max {
                probe.refused[i] = true;
                first = first.or(Some((i, used, add)));
            }
        }
        first
    }

    /// What the checks so far read of this room.
    pub fn probe(&self) -> Probe {
        self.probe.borrow().clone()
    }

    /// The charges of the replicas `placed` says are placed: (class, capacity type, replicas,
    /// price per replica).
    pub fn own<'c>(&self, devices: u32, placed: impl Iterator<Item = (&'c str, CapacityType, u32, u64)>) -> Vec<u64> {
        let mut own = vec![0u64; self.limits.len()];
        for (class, t, n, price) in placed {
            for (i, l) in self.limits.iter().enumerate() {
                own[i] += l.charge(class, t, devices, price) * u64::from(n);
            }
        }
        own
    }
}

impl<'s> Book<'s> {
    /// A book for `order`, or `None` when no quota limits any of its namespaces.
    pub fn new(snapshot: &'s FleetSnapshot, order: &[&'s DeploymentView]) -> Option<Self> {
        let limits = limits(snapshot);
        if limits.is_empty() || !order.iter().any(|d| limits.contains_key(d.namespace.as_str())) {
            return None;
        }
        let namespaces: Vec<&str> = order.iter().map(|d| d.namespace.as_str()).collect();
        let charged = namespaces.iter().map(|ns| vec![0; limits.get(ns).map_or(0, Vec::len)]).collect();
        let total = limits.iter().map(|(ns, l)| (*ns, vec![0; l.len()])).collect();
        Some(Book { snapshot, limits, charged, total, namespaces })
    }

    /// The room of the deployment at `i` in solve order; `None` when its namespace has no quota.
    pub fn room(&self, i: usize) -> Option<Room> {
        let ns = self.namespaces[i];
        let limits = self.limits.get(ns)?;
        let total = &self.total[ns];
        let others: Vec<u64> = total.iter().zip(&self.charged[i]).map(|(t, c)| t - c).collect();
        let n = others.len();
        let probe = Probe { others: others.clone(), peak: vec![0; n], refused: vec![false; n] };
        Some(Room { limits: limits.clone(), others, probe: std::cell::RefCell::new(probe) })
    }

    /// What the other deployments of the namespace of the deployment at `i` hold of each limit,
    /// with the limits; `None` when its namespace has no quota.
    pub fn others(&self, i: usize) -> Option<(Vec<u64>, &[Limit])> {
        let ns = self.namespaces[i];
        let limits = self.limits.get(ns)?;
        let others = self.total[ns].iter().zip(&self.charged[i]).map(|(t, c)| t - c).collect();
        Some((others, limits.as_slice()))
    }

    /// What the deployment at `i` is charged now, per limit of its namespace.
    pub fn charged(&self, i: usize) -> &[u64] {
        &self.charged[i]
    }

    /// Charges the deployment at `i` with `now` (a reused step's charges) instead of what it
    /// was charged before.
    pub fn set_charged(&mut self, i: usize, now: &[u64]) {
        let ns = self.namespaces[i];
        let Some(total) = self.total.get_mut(ns) else { return };
        if now.len() != total.len() {
            return;
        }
        for (k, v) in now.iter().enumerate() {
            total[k] = total[k] - self.charged[i][k] + v;
        }
        self.charged[i] = now.to_vec();
    }

    /// Charges the namespace of `d` with replicas that are not solved again (`preempt.rs`
    /// re-solves the tiers below one while the higher ones keep their places): (cluster index,
    /// pool index, replicas, price per replica).
    pub fn charge_fixed(&mut self, d: &DeploymentView, placed: impl Iterator<Item = (usize, usize, u32, u64)>) {
        let Some((&ns, limits)) = self.limits.get_key_value(d.namespace.as_str()) else { return };
        let add = charges(self.snapshot, limits, ReplicaShape::of(&d.spec.topology).devices(), placed);
        let total = self.total.entry(ns).or_insert_with(|| vec![0; limits.len()]);
        for (t, a) in total.iter_mut().zip(add) {
            *t += a;
        }
    }

    /// Charges the deployment at `i` with what `placed` says it holds now (cluster index, pool
    /// index, replicas, price per replica), instead of what it was charged before.
    pub fn charge(&mut self, i: usize, shape: &ReplicaShape, placed: impl Iterator<Item = (usize, usize, u32, u64)>) {
        let ns = self.namespaces[i];
        let Some(limits) = self.limits.get(ns) else { return };
        let now = charges(self.snapshot, limits, shape.devices(), placed);
        let total = self.total.entry(ns).or_insert_with(|| vec![0; now.len()]);
        for (k, v) in now.iter().enumerate() {
            total[k] = total[k] - self.charged[i][k] + v;
        }
        self.charged[i] = now;
    }
}

/// Usage against one limit of a quota, in a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitUsage {
    /// The device limit's index in `spec.devices`; `None`: `maxCostPerHour`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<usize>,
    /// What the limit counts, in words (`h100 devices`, `cost per hour`).
    pub subject: String,
    /// Used by the plan (devices, or micro-dollars per hour).
    pub used: u64,
    /// The limit.
    pub max: u64,
}

/// A quota's usage in a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaUsage {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Per limit.
    pub limits: Vec<LimitUsage>,
    /// Replicas of the namespace left unplaced because of this quota (`QuotaExceeded` on
    /// every cluster that refused them for a quota of this name).
    pub unplaced: u32,
}

impl QuotaUsage {
    /// Whether a limit is passed.
    pub fn over(&self) -> bool {
        self.limits.iter().any(|l| l.used > l.max)
    }

    /// `h100 devices 16/16, cost per hour $40.00/$120.00`.
    pub fn summary(&self) -> String {
        self.limits
            .iter()
            .map(|l| match l.device {
                Some(_) => format!("{} {}/{}", l.subject, l.used, l.max),
                None => format!("{} ${}/${}", l.subject, format_price_micros(l.used), format_price_micros(l.max)),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What every quota of `snapshot` holds in `plan`.
pub fn usage(snapshot: &FleetSnapshot, plan: &Plan) -> Vec<QuotaUsage> {
    usage_of(snapshot, &plan.deployments)
}

/// What every quota of `snapshot` holds in `plans`.
pub(crate) fn usage_of(snapshot: &FleetSnapshot, plans: &[DeploymentPlan]) -> Vec<QuotaUsage> {
    if snapshot.quotas.is_empty() {
        return Vec::new();
    }
    let limits = limits(snapshot);
    let shapes: BTreeMap<(&str, &str), u32> = snapshot
        .deployments
        .iter()
        .map(|d| ((d.namespace.as_str(), d.name.as_str()), ReplicaShape::of(&d.spec.topology).devices()))
        .collect();
    let mut used: BTreeMap<&str, Vec<u64>> = limits.iter().map(|(ns, l)| (*ns, vec![0; l.len()])).collect();
    for p in plans {
        let (Some(list), Some(u)) = (limits.get(p.namespace.as_str()), used.get_mut(p.namespace.as_str())) else {
            continue;
        };
        let devices = shapes.get(&(p.namespace.as_str(), p.name.as_str())).copied().unwrap_or(0);
        for a in &p.assignments {
            let price = a.cost_micros_per_hour / u64::from(a.replicas.max(1));
            for (k, l) in list.iter().enumerate() {
                u[k] += match l.device {
                    None => a.cost_micros_per_hour,
                    Some(_) => l.charge(&a.class, a.capacity_type, devices, price) * u64::from(a.replicas),
                };
            }
        }
    }
    snapshot
        .quotas
        .iter()
        .enumerate()
        .map(|(qi, q)| {
            let list = &limits[q.namespace.as_str()];
            let u = &used[q.namespace.as_str()];
            let limits = list
                .iter()
                .zip(u)
                .filter(|(l, _)| l.quota == qi)
                .map(|(l, &used)| LimitUsage {
                    device: l.device,
                    subject: l.device.map_or_else(|| "cost per hour".to_string(), |i| q.spec.devices[i].subject()),
                    used,
                    max: l.max,
                })
                .collect();
            QuotaUsage { namespace: q.namespace.clone(), name: q.name.clone(), limits, unplaced: unplaced_by(q, plans) }
        })
        .collect()
}

/// Replicas of `q`'s namespace the plan leaves short where a cluster refused for `q`.
fn unplaced_by(q: &QuotaView, plans: &[DeploymentPlan]) -> u32 {
    let tag = format!("FleetQuota {}/{}:", q.namespace, q.name);
    plans
        .iter()
        .filter(|p| p.namespace == q.namespace && p.unplaced > 0)
        .filter(|p| p.rejections.iter().any(|r| r.reason == Reason::QuotaExceeded && r.message.starts_with(&tag)))
        .map(|p| p.unplaced)
        .sum()
}

/// Whether some namespace holds more than a limit of its quotas allows in `plans`.
pub(crate) fn over(snapshot: &FleetSnapshot, plans: &[DeploymentPlan]) -> bool {
    if snapshot.quotas.is_empty() {
        return false;
    }
    usage_of(snapshot, plans).iter().any(QuotaUsage::over)
}

/// The words of a refusal of quota `quota`'s limit `device` (`None`: its cost limit) of `max`:
/// `FleetQuota team-a/gpus: h100 devices 12 of 16 used in the namespace; one more replica here needs 8`.
pub(crate) fn said(
    snapshot: &FleetSnapshot,
    quota: usize,
    device: Option<usize>,
    max: u64,
    used: u64,
    add: u64,
) -> String {
    let q = &snapshot.quotas[quota];
    match device {
        Some(i) => format!(
            "FleetQuota {}/{}: {} {used} of {max} used in the namespace; one more replica here needs {add}",
            q.namespace,
            q.name,
            q.spec.devices[i].subject(),
        ),
        None => format!(
            "FleetQuota {}/{}: ${}/h of ${}/h maxCostPerHour used in the namespace; one more replica here costs ${}/h",
            q.namespace,
            q.name,
            format_price_micros(used),
            format_price_micros(max),
            format_price_micros(add)
        ),
    }
}
