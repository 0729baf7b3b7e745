//! Controller metrics in Prometheus text format. Labels are closed enums (kind, outcome):
//! never an object name or an error's text.

use std::sync::Arc;
use std::time::Duration;

use flotilla_placement::ReplanStats;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The kind a reconcile was for.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Kind {
    /// InferenceCluster.
    InferenceCluster,
    /// ModelDeployment.
    ModelDeployment,
    /// CapacityClaim.
    CapacityClaim,
    /// ModelCache.
    ModelCache,
}

/// How a reconcile ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    /// Status written.
    Changed,
    /// Nothing to write.
    Unchanged,
    /// Failed; retried with backoff.
    Error,
}

/// Why a ModelDeployment was woken by a change of the fleet (`deployment::wake`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Wake {
    /// Its plan entry changed.
    PlanChanged,
    /// Its ModelCache changed.
    CacheChanged,
    /// A cluster it is placed on changed reachability, readiness or deletion.
    ClusterChanged,
    /// A class it uses changed.
    ClassChanged,
}

/// How a fleet plan was reached (`placement::Replanner`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum SolveMode {
    /// The whole fleet solved.
    Whole,
    /// Only the steps the changes reach run again; the rest reused.
    Incremental,
}

/// What became of one step of the solver's greedy pass in a solve.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum StepUse {
    /// Run.
    Run,
    /// Reused from the last solve.
    Reused,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SolveLabels {
    mode: SolveMode,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: StepUse,
}

/// What a member sweep pass did (`sweep.rs`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum SweepOutcome {
    /// Deleted what it found orphaned (possibly nothing).
    Swept,
    /// Would have deleted more than the bounded share: deleted nothing, waits for an operator.
    Held,
    /// Past the share bound, approved by the InferenceCluster's annotation.
    Approved,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SweepLabels {
    outcome: SweepOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WakeLabels {
    reason: Wake,
}
/// What a run-time check of an incremental re-plan found (`deployment::crosscheck`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ReplanCheck {
    /// The whole solve gave the same plan.
    Same,
    /// It did not: the whole plan was taken.
    Diverged,
    /// The whole solve failed; nothing compared.
    Failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplanCheckLabels {
    result: ReplanCheck,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    kind: Kind,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: Kind,
}

/// The controller's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    reconciles: Family<ReconcileLabels, Counter>,
    durations: Family<KindLabels, Histogram>,
    status_writes: Family<KindLabels, Counter>,
    wakes: Family<WakeLabels, Counter>,
    fleet_passes: Counter,
    solves: Family<SolveLabels, Counter>,
    solve_durations: Family<SolveLabels, Histogram>,
    solve_steps: Family<StepLabels, Counter>,
    solve_attempts: Family<StepLabels, Counter>,
    leader: Gauge,
    sweeps: Family<SweepLabels, Counter>,
    replan_checks: Family<ReplanCheckLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("flotilla_controller");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        let durations = Family::<KindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        let status_writes = Family::<KindLabels, Counter>::default();
        let wakes = Family::<WakeLabels, Counter>::default();
        let fleet_passes = Counter::default();
        let solves = Family::<SolveLabels, Counter>::default();
        let solve_durations = Family::<SolveLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 14))
        });
        let solve_steps = Family::<StepLabels, Counter>::default();
        let solve_attempts = Family::<StepLabels, Counter>::default();
        let leader = Gauge::default();
        registry.register("reconciles", "Reconciles by kind and outcome", reconciles.clone());
        registry.register("reconcile_duration_seconds", "Reconcile duration", durations.clone());
        registry.register("status_writes", "Status patches sent to the control cluster", status_writes.clone());
        registry.register(
            "deployment_wakes",
            "ModelDeployments woken by a change of the fleet, by reason",
            wakes.clone(),
        );
        registry.register(
            "fleet_passes",
            "Passes of the fleet trigger (one solve and one wake computation each)",
            fleet_passes.clone(),
        );
        registry.register("solves", "Fleet plans solved, whole or incrementally", solves.clone());
        registry.register("solve_duration_seconds", "Time to solve the fleet plan", solve_durations.clone());
        registry.register(
            "solve_steps",
            "Steps of the solver's greedy pass, run or reused from the last solve",
            solve_steps.clone(),
        );
        registry.register(
            "solve_phase_attempts",
            "Move attempts of the solver's improvement phase, run or reused from the last solve",
            solve_attempts.clone(),
        );
        registry.register("leader", "1 while this replica holds the leader lease", leader.clone());
        let sweeps = Family::<SweepLabels, Counter>::default();
        registry.register(
            "member_sweeps",
            "Sweep passes over members by outcome (held: past the share bound, waiting for an operator)",
            sweeps.clone(),
        );
        let replan_checks = Family::<ReplanCheckLabels, Counter>::default();
        registry.register(
            "replan_checks",
            "Incremental re-plans solved again whole at run time, by what the comparison found",
            replan_checks.clone(),
        );
        Self {
            registry: Arc::new(registry),
            reconciles,
            durations,
            status_writes,
            wakes,
            fleet_passes,
            solves,
            solve_durations,
            solve_steps,
            solve_attempts,
            leader,
            sweeps,
            replan_checks,
        }
    }
}

impl Metrics {
    /// Counts one member sweep pass.
    pub fn swept(&self, outcome: SweepOutcome) {
        self.sweeps.get_or_create(&SweepLabels { outcome }).inc();
    }

    /// Member sweep passes with `outcome` so far.
    pub fn sweeps(&self, outcome: SweepOutcome) -> u64 {
        self.sweeps.get_or_create(&SweepLabels { outcome }).get()
    }

    /// Counts one run-time check of an incremental re-plan.
    pub fn replan_checked(&self, result: ReplanCheck) {
        self.replan_checks.get_or_create(&ReplanCheckLabels { result }).inc();
    }

    /// Re-plan checks with `result` so far.
    pub fn replan_checks(&self, result: ReplanCheck) -> u64 {
        self.replan_checks.get_or_create(&ReplanCheckLabels { result }).get()
    }

    /// Counts one reconcile.
    pub fn reconciled(&self, kind: Kind, outcome: Outcome, took: Duration) {
        self.reconciles.get_or_create(&ReconcileLabels { kind, outcome }).inc();
        self.durations.get_or_create(&KindLabels { kind }).observe(took.as_secs_f64());
    }

    /// Counts one status write.
    pub fn status_write(&self, kind: Kind) {
        self.status_writes.get_or_create(&KindLabels { kind }).inc();
    }

    /// Status writes so far.
    pub fn status_writes(&self, kind: Kind) -> u64 {
        self.status_writes.get_or_create(&KindLabels { kind }).get()
    }

    /// Counts one ModelDeployment woken by a fleet change.
    pub fn woken(&self, reason: Wake) {
        self.wakes.get_or_create(&WakeLabels { reason }).inc();
    }

    /// Counts one pass of the fleet trigger.
    pub fn fleet_pass(&self) {
        self.fleet_passes.inc();
    }

    /// Counts one solve of the fleet plan: how, how long, and its greedy steps and improvement
    /// attempts run and reused.
    pub fn solved(&self, mode: SolveMode, took: Duration, stats: &ReplanStats) {
        self.solves.get_or_create(&SolveLabels { mode }).inc();
        self.solve_durations.get_or_create(&SolveLabels { mode }).observe(took.as_secs_f64());
        for (family, run, reused) in [
            (&self.solve_steps, stats.steps_run, stats.steps_reused),
            (&self.solve_attempts, stats.phase_run, stats.phase_reused),
        ] {
            family.get_or_create(&StepLabels { step: StepUse::Run }).inc_by(run as u64);
            family.get_or_create(&StepLabels { step: StepUse::Reused }).inc_by(reused as u64);
        }
    }

    /// Sets the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solves_are_counted_by_mode_with_their_steps() {
        let m = Metrics::default();
        let stats = |steps_run, steps_reused, phase_run, phase_reused| ReplanStats {
            steps_run,
            steps_reused,
            phase_run,
            phase_reused,
            ..ReplanStats::default()
        };
        m.solved(SolveMode::Whole, Duration::from_millis(40), &stats(120, 0, 9, 0));
        m.solved(SolveMode::Incremental, Duration::from_micros(900), &stats(3, 117, 1, 8));
        m.solved(SolveMode::Incremental, Duration::from_micros(800), &stats(2, 118, 0, 0));
        let text = m.encode();
        for line in [
            "flotilla_controller_solves_total{mode=\"Whole\"} 1",
            "flotilla_controller_solves_total{mode=\"Incremental\"} 2",
            "flotilla_controller_solve_steps_total{step=\"Run\"} 125",
            "flotilla_controller_solve_steps_total{step=\"Reused\"} 235",
            "flotilla_controller_solve_phase_attempts_total{step=\"Run\"} 10",
            "flotilla_controller_solve_phase_attempts_total{step=\"Reused\"} 8",
            "flotilla_controller_solve_duration_seconds_count{mode=\"Whole\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
