//! How many of a member workload's replicas count as Ready: only those that run the spec
//! Flotilla applied last. A Deployment (or LeaderWorkerSet) whose controller has not yet
//! observed the current `metadata.generation` gives no evidence about the current spec, so
//! none of its replicas count; once it has, the count is the ready replicas that are surely
//! updated: `readyReplicas - (replicas - updatedReplicas)` (the ready ones, minus every old
//! replica that might be among them), never more than `updatedReplicas`. Old replicas still
//! serve, so make-before-break counts them separately (`Readiness::serving`). Pure.

/// What a workload's status says, in the fields the rule reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkloadStatus {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.observedGeneration` (for a LeaderWorkerSet without it, its conditions').
    pub observed_generation: Option<i64>,
    /// `status.replicas`: every replica (group) there is, old or new, ready or not.
    pub replicas: i32,
    /// `status.readyReplicas`, old or new.
    pub ready: i32,
    /// `status.updatedReplicas`: replicas of the current template, ready or not.
    pub updated: i32,
}

/// A workload's replicas as readiness counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Ready replicas of any template: they serve traffic (make-before-break keeps them).
    pub serving: i32,
    /// Ready replicas of the current template: what status reports as ready.
    pub current: i32,
}

/// The readiness rule (see the module header).
pub fn readiness(s: &WorkloadStatus) -> Readiness {
    let serving = s.ready.max(0);
    let observed = match (s.generation, s.observed_generation) {
        (Some(g), Some(o)) => o >= g,
        // The API server always sets a generation; without one there is nothing to lag behind.
        (None, Some(_)) => true,
        (_, None) => false,
    };
    if !observed {
        return Readiness { serving, current: 0 };
    }
    let old = (s.replicas - s.updated).max(0);
    let current = (serving - old).clamp(0, s.updated.max(0));
    Readiness { serving, current }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(generation: i64, observed: Option<i64>, replicas: i32, ready: i32, updated: i32) -> WorkloadStatus {
        WorkloadStatus { generation: Some(generation), observed_generation: observed, replicas, ready, updated }
    }

    #[test]
    fn a_settled_workload_counts_all_its_ready_replicas() {
        assert_eq!(readiness(&st(3, Some(3), 4, 4, 4)), Readiness { serving: 4, current: 4 });
        assert_eq!(readiness(&st(3, Some(3), 4, 2, 4)), Readiness { serving: 2, current: 2 });
    }

    #[test]
    fn a_spec_its_controller_has_not_seen_counts_nothing_as_ready() {
        // A new image was applied (generation 4); the status still describes generation 3,
        // where all 4 replicas were ready and updated. They serve, but are not Ready evidence.
        assert_eq!(readiness(&st(4, Some(3), 4, 4, 4)), Readiness { serving: 4, current: 0 });
        // No observedGeneration at all (a LeaderWorkerSet that does not report it): no evidence.
        assert_eq!(readiness(&st(1, None, 2, 2, 2)), Readiness { serving: 2, current: 0 });
    }

    #[test]
    fn mid_rollout_only_surely_updated_ready_replicas_count() {
        // 4 wanted, surge 1: 5 replicas, 1 updated (not ready yet), 4 old ready.
        assert_eq!(readiness(&st(4, Some(4), 5, 4, 1)), Readiness { serving: 4, current: 0 });
        // 2 updated, 3 old, 4 ready: at least 1 of the ready ones is updated.
        assert_eq!(readiness(&st(4, Some(4), 5, 4, 2)), Readiness { serving: 4, current: 1 });
        // Done: every replica updated and ready.
        assert_eq!(readiness(&st(4, Some(4), 4, 4, 4)), Readiness { serving: 4, current: 4 });
    }

    #[test]
    fn counts_never_exceed_the_updated_replicas_nor_go_negative() {
        // A status that claims more ready than exist (a racing read) still caps at updated.
        assert_eq!(readiness(&st(2, Some(2), 2, 5, 2)).current, 2);
        assert_eq!(readiness(&st(2, Some(2), 3, 0, 1)).current, 0);
        assert_eq!(readiness(&st(2, Some(2), 0, -1, 0)), Readiness { serving: 0, current: 0 });
    }
}
