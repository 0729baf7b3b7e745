//! The incremental re-plan checked at run time. The re-plan (`placement/src/replan.rs`) is
//! proven equal to a whole solve by property tests; in production, one incremental re-plan in
//! `--replan-check-every` (16 by default; 0: never) is solved again whole, on a thread of its
//! own, off the reconciles' path. A divergence is counted
//! (`flotilla_controller_replan_checks_total{result="Diverged"}`), logged as an error with the
//! deployments whose entries differ and a reproducer written to a directory (the fleet the
//! re-plan started from, the fleet it planned, both plans), and resolved by the whole plan:
//! the solver's state is replaced by the whole solve, the plan's key moves on so that the next
//! reconcile takes it, and the fleet trigger is ticked to wake the deployments it changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use flotilla_apis::{FleetQuota, InferenceClass, InferenceCluster, ModelCache, ModelDeployment};
use flotilla_placement::plan::DeploymentPlan;
use flotilla_placement::{FleetSnapshot, Plan, Replanner};
use futures_util::Stream;

use crate::metrics::{Metrics, ReplanCheck};

/// The objects one solve read (shared with the stores: holding them costs pointers).
#[derive(Clone, Default)]
pub struct FleetObjects {
    /// InferenceClasses.
    pub classes: Vec<Arc<InferenceClass>>,
    /// InferenceClusters (those the snapshot kept).
    pub clusters: Vec<Arc<InferenceCluster>>,
    /// ModelCaches.
    pub caches: Vec<Arc<ModelCache>>,
    /// ModelDeployments (those the snapshot kept).
    pub deployments: Vec<Arc<ModelDeployment>>,
    /// FleetQuotas.
    pub quotas: Vec<Arc<FleetQuota>>,
}

impl FleetObjects {
    /// The snapshot `fleetctl plan --live` builds from the same objects.
    pub fn snapshot(&self) -> FleetSnapshot {
        FleetSnapshot::from_live(
            self.classes.iter().map(|c| c.as_ref().clone()),
            self.clusters.iter().map(|c| c.as_ref().clone()),
            self.caches.iter().map(|c| c.as_ref().clone()),
            self.deployments.iter().map(|d| d.as_ref().clone()),
        )
        .with_quotas(self.quotas.iter().map(|q| q.as_ref().clone()))
    }

    /// Every object as one multi-document YAML stream, status included (the solver reads the
    /// placements deployments recorded), managed fields left out.
    pub fn to_yaml(&self) -> String {
        let mut out = String::new();
        push_docs(&mut out, &self.classes);
        push_docs(&mut out, &self.clusters);
        push_docs(&mut out, &self.caches);
        push_docs(&mut out, &self.deployments);
        push_docs(&mut out, &self.quotas);
        out
    }
}

fn push_docs<K: kube::Resource + serde::Serialize + Clone>(out: &mut String, objects: &[Arc<K>]) {
    for o in objects {
        let mut o = o.as_ref().clone();
        o.meta_mut().managed_fields = None;
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&o).unwrap_or_else(|e| format!("# not serialisable: {e}\n")));
    }
}

/// The deployments (`namespace/name`) whose entries differ between two plans, or that only
/// one of them has.
pub fn differing(replanned: &Plan, whole: &Plan) -> Vec<String> {
    let by_key = |p: &Plan| -> BTreeMap<(String, String), DeploymentPlan> {
        p.deployments.iter().map(|d| ((d.namespace.clone(), d.name.clone()), d.clone())).collect()
    };
    let (a, b) = (by_key(replanned), by_key(whole));
    let mut keys: Vec<&(String, String)> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).map(|(ns, name)| format!("{ns}/{name}")).collect()
}

/// One incremental re-plan to check: the fleet it started from, the fleet it planned (and
/// the snapshot of it it planned, quarantined deployments left out), and its plan.
pub struct Sample {
    /// The objects of the solve the re-plan started from.
    pub before: Option<FleetObjects>,
    /// The objects it planned.
    pub after: FleetObjects,
    /// The snapshot it planned.
    pub snapshot: FleetSnapshot,
    /// Its plan.
    pub plan: Plan,
}

/// What a check found.
pub enum Found {
    /// The whole solve gives the same plan.
    Same,
    /// They differ: the deployments whose entries differ, the reproducer's directory (if it
    /// could be written), and the whole solve.
    Diverged(Vec<String>, Option<PathBuf>, Box<Replanner>),
    /// The whole solve failed (panicked): nothing to compare.
    Failed,
}

/// The run-time check's schedule and its way back to the controller.
pub struct CrossCheck {
    every: u64,
    dir: PathBuf,
    replans: AtomicU64,
    /// A check is running: at most one at a time (one whole solve beside the controller's),
    /// and no sample is taken meanwhile.
    running: AtomicBool,
    epoch: AtomicU64,
    resolved: tokio::sync::watch::Sender<u64>,
    metrics: Metrics,
}

impl CrossCheck {
    /// Checks one incremental re-plan in `every` (0: none); reproducers go under `dir`.
    pub fn new(every: u64, dir: PathBuf, metrics: Metrics) -> Self {
        let (resolved, _) = tokio::sync::watch::channel(0);
        Self {
            every,
            dir,
            replans: AtomicU64::new(0),
            running: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            resolved,
            metrics,
        }
    }

    /// Counts one incremental re-plan; whether this one is to be checked: one in `every`, and
    /// none while the last one's check still runs (then the next one in `every` is). A `true`
    /// marks a check running until [`CrossCheck::finished`].
    pub fn due(&self) -> bool {
        self.every > 0
            && (self.replans.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(self.every)
            && self.running.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// The check [`CrossCheck::due`] started is over.
    pub fn finished(&self) {
        self.running.store(false, Ordering::SeqCst);
    }

    /// Moves on with every divergence resolved: part of the plan's key, so that the next
    /// reconcile solves again (from the whole solve) rather than keep the diverged plan.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Yields once after each resolved divergence (the fleet trigger listens).
    pub fn resolutions(&self) -> impl Stream<Item = ()> + Send + 'static {
        let rx = self.resolved.subscribe();
        futures_util::stream::unfold(rx, |mut rx| async move { rx.changed().await.ok().map(|()| ((), rx)) })
    }

    /// Solves `sample`'s fleet whole with `solve` and compares; a divergence is counted, logged
    /// and written as a reproducer. Runs on the caller's thread (a thread of its own in the
    /// controller: [`CrossCheck::spawn`]).
    pub fn check(&self, sample: &Sample, solve: impl FnOnce(&FleetSnapshot) -> Replanner) -> Found {
        let whole = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| solve(&sample.snapshot))) {
            Ok(w) => w,
            Err(_) => {
                self.metrics.replan_checked(ReplanCheck::Failed);
                tracing::warn!("re-plan check: the whole solve failed; the re-plan is kept");
                return Found::Failed;
            }
        };
        let mut plan = sample.plan.clone();
        plan.sort_by_name();
        let mut whole_plan = whole.plan().clone();
        whole_plan.sort_by_name();
        let differ = differing(&plan, &whole_plan);
        if differ.is_empty() {
            self.metrics.replan_checked(ReplanCheck::Same);
            return Found::Same;
        }
        self.metrics.replan_checked(ReplanCheck::Diverged);
        let repro = write_reproducer(&self.dir, sample, &whole_plan);
        tracing::error!(
            deployments = %differ.join(","),
            reproducer = %repro.as_ref().map_or_else(|e| format!("not written: {e}"), |p| p.display().to_string()),
            "the incremental re-plan differs from a whole solve of the same fleet: the whole plan is taken"
        );
        Found::Diverged(differ, repro.ok(), Box::new(whole))
    }

    /// Checks `sample` on a thread of its own; a divergence hands the whole solve to `resolve`
    /// (which puts it in the solver's state), then moves the plan's key on and ticks the fleet
    /// trigger.
    pub fn spawn(
        self: &Arc<Self>,
        sample: Sample,
        solve: impl FnOnce(&FleetSnapshot) -> Replanner + Send + 'static,
        resolve: impl FnOnce(Replanner) + Send + 'static,
    ) {
        let this = self.clone();
        let started = std::thread::Builder::new().name("replan-check".into()).spawn(move || {
            if let Found::Diverged(_, _, whole) = this.check(&sample, solve) {
                resolve(*whole);
                this.epoch.fetch_add(1, Ordering::SeqCst);
                this.resolved.send_modify(|n| *n = n.wrapping_add(1));
            }
            this.finished();
        });
        if let Err(e) = started {
            self.finished();
            tracing::warn!("re-plan check not started: {e}");
        }
    }
}

/// Writes `before.yaml`, `after.yaml`, `replanned.json` and `whole.json` into a new directory
/// under `dir`; returns it.
fn write_reproducer(dir: &Path, sample: &Sample, whole: &Plan) -> Result<PathBuf, String> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    let out = dir.join(format!("flotilla-replan-divergence-{stamp}"));
    let write = |name: &str, text: String| std::fs::write(out.join(name), text).map_err(|e| format!("{name}: {e}"));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let before = sample.before.as_ref().map_or_else(|| "# no earlier solve kept\n".into(), FleetObjects::to_yaml);
    write("before.yaml", before)?;
    write("after.yaml", sample.after.to_yaml())?;
    let json = |p: &Plan| serde_json::to_string_pretty(p).unwrap_or_default();
    write("replanned.json", json(&sample.plan))?;
    write("whole.json", json(whole))?;
    Ok(out)
}

#[cfg(test)]
#[path = "crosscheck_tests.rs"]
mod tests;
