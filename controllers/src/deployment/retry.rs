//! Back-off for a deployment whose objects a member refuses. A refusal that lasts (an admission
//! policy that denies the Deployment, a quota, a Service range that is full) would otherwise be
//! written again on every converging requeue, every 2 s, for as long as it lasts: one request
//! per member and deployment, forever. Each reconcile in a row whose apply failed waits twice as
//! long as the one before (2 s, 4 s, 8 s, …, at most the settled poll); a success ends the
//! streak. Changes still wake the deployment at once (`trigger.rs`: its plan, its cache, its
//! clusters), so a fixed member is tried again as soon as anything about it changes. The streaks
//! are kept in memory only, one entry per deployment whose last apply failed: a restarted
//! controller starts from 2 s again.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The first wait after a failed apply: the converging requeue.
const FIRST: Duration = Duration::from_secs(2);

/// Failed applies in a row, per deployment (`namespace/name`).
#[derive(Default)]
pub(crate) struct ApplyFailures {
    streaks: Mutex<HashMap<String, u32>>,
}

/// What [`ApplyFailures::record`] says of a reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Streak {
    /// Failed applies in a row, this one included (0 after a success).
    pub now: u32,
    /// The same before this reconcile.
    pub before: u32,
}

impl ApplyFailures {
    /// Records whether deployment `key`'s member apply `failed` in this reconcile.
    pub(crate) fn record(&self, key: &str, failed: bool) -> Streak {
        let mut streaks = self.streaks.lock().unwrap_or_else(PoisonError::into_inner);
        let before = streaks.get(key).copied().unwrap_or(0);
        let now = if failed { before.saturating_add(1) } else { 0 };
        if now == 0 {
            streaks.remove(key);
        } else {
            streaks.insert(key.to_string(), now);
        }
        Streak { now, before }
    }

    /// Forgets deployment `key` (deleted).
    pub(crate) fn forget(&self, key: &str) {
        self.streaks.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
    }
}

/// The wait before looking again after `streak` failed applies in a row (at least 1): 2 s,
/// doubling with each, at most `cap`.
pub(crate) fn retry_after(streak: u32, cap: Duration) -> Duration {
    let doublings = streak.saturating_sub(1).min(20);
    FIRST.saturating_mul(1 << doublings).min(cap.max(FIRST))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_with_each_failure_in_a_row_up_to_the_cap() {
        let cap = Duration::from_secs(120);
        let waits: Vec<u64> = (1..=9).map(|s| retry_after(s, cap).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 120, 120, 120]);
        assert_eq!(retry_after(u32::MAX, cap), cap, "no overflow, however long it lasts");
        assert_eq!(retry_after(1, Duration::from_secs(1)), FIRST, "never sooner than the converging requeue");
    }

    #[test]
    fn a_success_ends_the_streak_and_deployments_count_apart() {
        let f = ApplyFailures::default();
        assert_eq!(f.record("ml/a", true), Streak { now: 1, before: 0 });
        assert_eq!(f.record("ml/a", true), Streak { now: 2, before: 1 });
        assert_eq!(f.record("ml/b", true), Streak { now: 1, before: 0 }, "another deployment's streak is its own");
        assert_eq!(f.record("ml/a", false), Streak { now: 0, before: 2 });
        assert_eq!(f.record("ml/a", true), Streak { now: 1, before: 0 }, "a new streak starts from the first wait");
        f.forget("ml/b");
        assert_eq!(f.record("ml/b", false), Streak { now: 0, before: 0 });
        assert!(f.streaks.lock().unwrap_or_else(PoisonError::into_inner).len() == 1, "only ml/a is failing");
    }
}
