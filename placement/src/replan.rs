//! Incremental re-plan. The greedy pass is a sequence of steps: per priority tier, every
//! running deployment keeps what it runs (a keep step), then every deployment places the rest
//! (a fill step). A step is a pure function of its deployment, the free devices of the pools it
//! reads (`free.rs` notes them) and, for a keep step, the tier's `open` view; a fill step also
//! takes what its keep step left. So a re-plan walks the steps again and runs only those whose
//! deployment changed or that read a pool whose free devices differ, at that point, from the
//! last solve (a "dirty" pool); every other step's output and writes are reused. A pool stays
//! dirty until a step that runs again leaves it as the last solve did. Which later steps read a
//! dirty pool comes from an index (pool → steps that read it), so the walk costs the steps that
//! run again, not every candidate of every deployment. A deployment whose namespace has
//! FleetQuotas also reads its room (what the namespace's other deployments hold of each limit):
//! its step runs again only when the room would answer one of its checks otherwise
//! (`quota::Probe::holds`), and a reused step charges the namespace as before.
//!
//! The plan is byte for byte the one `solve` gives for the same snapshot (a property test checks
//! it on random change sequences). A re-plan solves the whole fleet when what it would reuse
//! cannot stand: the first solve, clusters that changed in more than their pools' free devices
//! (capacity observed: those pools are dirty from the start), other classes, other FleetQuotas,
//! another set of deployments (or another solve order), explain mode, a solve whose evaluations near the budget
//! or whose trace would outgrow its bound. When the greedy pass leaves replicas unplaced and the
//! improvement phase is on, the phase runs on the replayed pass's result as `solve` runs it, its
//! move attempts reused where what they read is unchanged (`phase_trace.rs`); the greedy plans it
//! changed, its deployment data and the solve's caches are kept for the next re-plan.

use std::collections::{BTreeMap, HashMap};

use super::free::StepIo;
use super::held::Held;
use super::improve::PhaseMemo;
use super::quota::Probe;
use super::{Fixed, Kept, SolveOptions, order_indices, solve, solve_cmp};
use crate::devices::MatcherMemo;
use crate::filters::StaticMemo;
use crate::plan::{DeploymentPlan, Plan};
use crate::snapshot::{ClassView, ClusterView, DeploymentView, FleetSnapshot, PoolView, QuotaView};
use tier_open::TierOpen;
use walk::Walk;

/// Keeps the last plan and how it was reached, and re-plans the next snapshot from them.
pub struct Replanner {
    options: SolveOptions,
    clusters: Vec<ClusterView>,
    classes: BTreeMap<String, ClassView>,
    /// The FleetQuotas, as last solved (a re-plan with other quotas solves whole).
    quotas: Vec<QuotaView>,
    /// The deployments in solve order, as last solved.
    deployments: Vec<DeploymentView>,
    /// Their positions in the last snapshot's list, and whether no two share a place in the
    /// order (then the same names at the same positions are the same order).
    order_ix: Vec<usize>,
    unique: bool,
    /// What the solve works out once from the clusters and classes.
    fixed: Option<Fixed>,
    /// Entries a trace may hold (`MAX_TRACE_ENTRIES`).
    limit: u64,
    /// A whole solve's trace outgrew `limit` (or its evaluations neared the budget): every
    /// solve is whole from then on, untraced.
    untraceable: bool,
    /// The last plan (after the improvement phase, when it ran).
    plan: Plan,
    /// The greedy pass's plans that the improvement phase changed (solve-order index, plan):
    /// with `plan`, the last greedy pass, which the next walk starts from.
    greedy_saved: Vec<(usize, DeploymentPlan)>,
    /// When a same-tier trade replaced the plan (`trade.rs`): the plans before it, in solve
    /// order, which `greedy_saved` applies to.
    untraded: Option<Vec<DeploymentPlan>>,
    /// The last greedy pass, step by step; `None` when the last plan cannot be re-planned from
    /// (explain mode, the evaluations neared the budget, the trace outgrew its bound).
    trace: Option<Trace>,
    stats: ReplanStats,
}

/// What the last solve or re-plan did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplanStats {
    /// The whole fleet was solved.
    pub full: bool,
    /// Steps of the greedy pass run.
    pub steps_run: usize,
    /// Steps reused from the last solve.
    pub steps_reused: usize,
    /// Entries the trace kept for the next re-plan holds (0: none kept).
    pub trace_entries: u64,
    /// The improvement phase's move attempts (one per deployment left short, until its budget
    /// is spent) run, and reused from the last solve.
    pub phase_run: usize,
    pub phase_reused: usize,
}

/// One step as it ran: what it read and wrote, and the evaluations it cost.
#[derive(Clone, Debug, Default)]
struct Step {
    io: StepIo,
    cost: u64,
    /// When its namespace has FleetQuotas: what the step read of its room, and what it left
    /// its deployment charged with (`quota.rs`).
    quota: Option<StepQuota>,
}

/// A step's quota input and output: a step is reused only when its room answers every check as
/// before (`Probe::holds`); a reused step charges its deployment as before.
#[derive(Clone, Debug)]
struct StepQuota {
    probe: Probe,
    charged: Vec<u64>,
}

/// A keep step and what it left for the fill step (`None`: the spec is invalid; the fill step
/// says so).
#[derive(Clone)]
struct KeepStep {
    step: Step,
    kept: Option<Kept>,
}

struct Trace {
    /// Per deployment in solve order: its keep step (when it ran one) and its fill step.
    keep: Vec<Option<KeepStep>>,
    fill: Vec<Step>,
    /// Per deployment in solve order, the first deployment of its tier.
    tier_start: Vec<usize>,
    /// Per tier (by its first deployment): the `open` view its keep steps judged spread on.
    open: HashMap<usize, TierOpen>,
    /// Flat pool → positions (`position`) of the steps that read it, ascending.
    readers: Vec<Vec<u64>>,
    evaluations: u64,
    /// Entries held (`entries`).
    entries: u64,
    /// Per deployment in solve order, where the greedy pass put its replicas (what the
    /// improvement phase starts from).
    held: Vec<Vec<Held>>,
    /// The improvement phase's deployment data, for the next re-plan's phase.
    phase: PhaseMemo,
    /// What the device matcher compiled and judged (the classes are the same in a re-plan).
    matcher: Option<MatcherMemo>,
    /// The static filters' verdicts per policy (the clusters' static facts are the same).
    statics: StaticMemo,
}

/// Entries (pools read, values written) a trace may hold by default, about 12 bytes each with
/// the index: a fleet whose trace would be larger is solved whole every time rather than hold
/// it (the 1,000 × 5,000 benchmark fleet needs a fraction of this).
pub const MAX_TRACE_ENTRIES: u64 = 16_000_000;

impl Replanner {
    /// Solves `snapshot` whole, keeping what a re-plan needs.
    pub fn new(snapshot: &FleetSnapshot, options: SolveOptions) -> Self {
        Self::with_limit(snapshot, options, MAX_TRACE_ENTRIES)
    }

    /// As [`Replanner::new`], with the trace held to `limit` entries (`MAX_TRACE_ENTRIES`).
    pub fn with_limit(snapshot: &FleetSnapshot, options: SolveOptions, limit: u64) -> Self {
        let mut r = Self {
            options,
            clusters: Vec::new(),
            classes: BTreeMap::new(),
            quotas: Vec::new(),
            deployments: Vec::new(),
            order_ix: Vec::new(),
            unique: false,
            fixed: None,
            limit,
            untraceable: false,
            plan: Plan::default(),
            greedy_saved: Vec::new(),
            untraded: None,
            trace: None,
            stats: ReplanStats::default(),
        };
        r.full(snapshot);
        r
    }

    /// The last plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The last plan, owned.
    pub fn into_plan(self) -> Plan {
        self.plan
    }

    /// What the last solve or re-plan did.
    pub fn stats(&self) -> ReplanStats {
        self.stats
    }

    /// The plan for `snapshot`: the one `solve` gives, reusing what its changes cannot affect.
    pub fn replan(&mut self, snapshot: &FleetSnapshot) -> &Plan {
        // The same place in the solve order: priority, creation, namespace and name.
        let same_key = |a: &DeploymentView, b: &DeploymentView| solve_cmp(a, b).is_eq();
        let n = self.deployments.len();
        // The last order still holds when every position names the same deployment and no two
        // tie; otherwise sort again.
        let kept_order = self.unique
            && snapshot.deployments.len() == n
            && self.order_ix.iter().zip(&self.deployments).all(|(&i, b)| same_key(&snapshot.deployments[i], b));
        let order_ix = if kept_order { std::mem::take(&mut self.order_ix) } else { order_indices(snapshot) };
        let order: Vec<&DeploymentView> = order_ix.iter().map(|&i| &snapshot.deployments[i]).collect();
        let same_frame = self.trace.is_some()
            && order.len() == n
            && (kept_order || order.iter().zip(&self.deployments).all(|(a, b)| same_key(a, b)))
            && snapshot.classes == self.classes
            && snapshot.quotas == self.quotas;
        // Clusters may differ in their pools' free devices (capacity observed), nothing else.
        let capacity = if same_frame { free_changes(&snapshot.clusters, &self.clusters) } else { None };
        self.order_ix = order_ix;
        let (Some(fixed), Some(capacity)) = (self.fixed.take().filter(|_| same_frame), capacity) else {
            self.full(snapshot);
            return self.plan();
        };
        let changed: Vec<bool> = order.iter().zip(&self.deployments).map(|(a, b)| *a != b).collect();
        let prev = self.trace.take();
        // The walk starts from the last greedy pass's plans.
        if let Some(untraded) = self.untraded.take() {
            self.plan = Plan { deployments: untraded, ..Plan::default() };
        }
        for (i, p) in self.greedy_saved.drain(..) {
            self.plan.deployments[i] = p;
        }
        let changes = Changes { deployments: &changed, capacity: &capacity };
        let plans = &mut self.plan.deployments;
        let outcome = Walk::run(snapshot, &fixed, &order, &self.options, prev, changes, plans, self.limit);
        self.fixed = Some(fixed);
        match outcome {
            Outcome::Traced(t) => {
                let Traced { trace, stats, greedy_saved } = *t;
                self.greedy_saved = greedy_saved;
                for (ci, pi, _) in capacity {
                    self.clusters[ci].pools[pi]
                        .free_per_node
                        .clone_from(&snapshot.clusters[ci].pools[pi].free_per_node);
                }
                for (i, d) in order.iter().enumerate() {
                    if changed[i] {
                        self.deployments[i] = (*d).clone();
                    }
                }
                self.trace = Some(trace);
                self.stats = stats;
                self.trade(snapshot, &order);
                self.settle_quotas(snapshot);
            }
            Outcome::Abort => self.full(snapshot),
        }
        self.plan()
    }

    /// Solves `snapshot` whole: traced when a later re-plan can start from it.
    fn full(&mut self, snapshot: &FleetSnapshot) {
        self.order_ix = order_indices(snapshot);
        let order: Vec<&DeploymentView> = self.order_ix.iter().map(|&i| &snapshot.deployments[i]).collect();
        self.unique = order.windows(2).all(|w| solve_cmp(w[0], w[1]) == std::cmp::Ordering::Less);
        self.clusters = snapshot.clusters.clone();
        self.classes = snapshot.classes.clone();
        self.quotas.clone_from(&snapshot.quotas);
        self.deployments = order.iter().map(|d| (*d).clone()).collect();
        self.trace = None;
        self.greedy_saved = Vec::new();
        self.untraded = None;
        let fixed = Fixed::of(snapshot);
        let n = order.len();
        let mut plans = Vec::with_capacity(n);
        let outcome = if self.options.explain.is_none() && !self.untraceable {
            let changes = Changes { deployments: &vec![true; n], capacity: &[] };
            Walk::run(snapshot, &fixed, &order, &self.options, None, changes, &mut plans, self.limit)
        } else {
            Outcome::Abort
        };
        self.fixed = Some(fixed);
        self.stats = ReplanStats { full: true, ..ReplanStats::default() };
        match outcome {
            Outcome::Traced(t) => {
                let Traced { trace, stats, greedy_saved } = *t;
                self.plan = Plan { deployments: plans, ..Plan::default() };
                self.greedy_saved = greedy_saved;
                self.trace = Some(trace);
                self.stats = ReplanStats { full: true, ..stats };
                self.trade(snapshot, &order);
                self.settle_quotas(snapshot);
            }
            Outcome::Abort => {
                self.untraceable |= self.options.explain.is_none();
                self.plan = solve(snapshot, &self.options);
            }
        }
    }
}

impl Replanner {
    /// The walk's plan (the greedy pass and the improvement phase, as `solve` gives them) with
    /// `solve`'s same-tier trades applied; the plan before them kept for the next walk.
    fn trade(&mut self, snapshot: &FleetSnapshot, order: &[&DeploymentView]) {
        let Some(fixed) = self.fixed.as_ref() else { return };
        if let Some(traded) = super::trade::trade(snapshot, &self.options, fixed, order, &self.plan) {
            self.untraded = Some(std::mem::replace(&mut self.plan, traded).deployments);
        }
    }

    /// The plan's FleetQuota usage, as `solve` ends: should a step after the greedy pass have
    /// taken a namespace past a limit, the plan is the greedy pass alone (which the walk left:
    /// the plan before the phase and the trades, with the greedy plans the phase changed).
    fn settle_quotas(&mut self, snapshot: &FleetSnapshot) {
        if snapshot.quotas.is_empty() {
            return;
        }
        if self.options.max_improvement > 0 && super::quota::over(snapshot, &self.plan.deployments) {
            let mut greedy = match self.untraded.take() {
                Some(untraded) => untraded,
                None => std::mem::take(&mut self.plan.deployments),
            };
            for (i, p) in self.greedy_saved.drain(..) {
                greedy[i] = p;
            }
            self.plan = Plan { deployments: greedy, ..Plan::default() };
        }
        self.plan.quotas = super::quota::usage(snapshot, &self.plan);
    }
}

/// The pools whose free devices per node differ between `new` and `old` (not their number of
/// nodes), as (cluster, pool, the old value); `None` when the clusters differ in anything else
/// (names, labels, readiness, taints, pools, caches...), which the static filters read.
fn free_changes(new: &[ClusterView], old: &[ClusterView]) -> Option<Vec<(usize, usize, Vec<u32>)>> {
    if new.len() != old.len() {
        return None;
    }
    let mut changes = Vec::new();
    for (ci, (a, b)) in new.iter().zip(old).enumerate() {
        // Every field named, so that a new one is not left out of the comparison.
        let ClusterView {
            name,
            labels,
            region,
            zones,
            jurisdiction,
            ready,
            not_ready_reason,
            cordoned,
            taints,
            pools,
            ready_caches,
        } = a;
        let same = *name == b.name
            && *labels == b.labels
            && *region == b.region
            && *zones == b.zones
            && *jurisdiction == b.jurisdiction
            && *ready == b.ready
            && *not_ready_reason == b.not_ready_reason
            && *cordoned == b.cordoned
            && *taints == b.taints
            && *ready_caches == b.ready_caches
            && pools.len() == b.pools.len();
        if !same {
            return None;
        }
        for (pi, (p, q)) in pools.iter().zip(&b.pools).enumerate() {
            let PoolView { name, class, capacity_type, free_per_node, reserved_for, refused_block } = p;
            let same = *name == q.name
                && *class == q.class
                && *capacity_type == q.capacity_type
                && *reserved_for == q.reserved_for
                && *refused_block == q.refused_block
                && free_per_node.len() == q.free_per_node.len();
            if !same {
                return None;
            }
            if *free_per_node != q.free_per_node {
                changes.push((ci, pi, q.free_per_node.clone()));
            }
        }
    }
    Some(changes)
}

/// What changed since the last solve: per deployment in solve order, and the pools whose free
/// devices the snapshot reports otherwise (`free_changes`).
struct Changes<'c> {
    deployments: &'c [bool],
    capacity: &'c [(usize, usize, Vec<u32>)],
}

/// A traced walk (its plans are written in place), and the greedy plans the improvement phase
/// changed when the greedy pass left it work.
struct Traced {
    trace: Trace,
    stats: ReplanStats,
    greedy_saved: Vec<(usize, DeploymentPlan)>,
}

/// How a walk ended.
enum Outcome {
    /// The greedy pass, traced.
    Traced(Box<Traced>),
    /// Nothing reusable: solve the fleet whole.
    Abort,
}

#[path = "tier_open.rs"]
mod tier_open;
#[path = "walk.rs"]
mod walk;
