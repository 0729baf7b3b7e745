//! Back-off for the writes a member refuses. A refusal that lasts (an admission policy that
//! denies the Deployment, a quota, a Service range that is full) would otherwise be written
//! again on every converging requeue, every 2 s, for as long as it lasts: one request per
//! member and deployment, forever. After each failed write of a deployment's objects to a
//! member, the next write there waits twice as long as the one before (2 s, 4 s, 8 s, …, at most
//! the cap: 12 polls); a write that goes through ends it. Only that member waits: the
//! deployment's reconciles go on at their own pace, so its other members still get their
//! writes and its readiness is still seen. While a member waits, the deployment's status keeps
//! that member's last refusal (`ApplyFailed`). Kept in memory only, one entry per deployment and
//! member whose last write failed: a restarted controller tries at once.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The first wait after a failed write: the converging requeue.
const FIRST: Duration = Duration::from_secs(2);

/// Why and until when a deployment's writes to a member wait.
struct Failing {
    /// Failed writes in a row.
    streak: u32,
    /// The member's last answer.
    message: String,
    /// No write before this.
    retry_at: Instant,
}

/// Failed writes in a row, per deployment (`namespace/name`), then member: a reconcile touches
/// only its own deployment's entries.
#[derive(Default)]
pub(crate) struct ApplyFailures {
    failing: Mutex<HashMap<String, HashMap<String, Failing>>>,
}

/// What [`ApplyFailures::record`] says of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Streak {
    /// Failed writes in a row, this one included (0 after a success).
    pub now: u32,
    /// The same before this write.
    pub before: u32,
}

impl ApplyFailures {
    /// The member's last refusal while deployment `key`'s next write to `cluster` must wait.
    pub(crate) fn waiting(&self, key: &str, cluster: &str, now: Instant) -> Option<String> {
        let failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        failing.get(key)?.get(cluster).filter(|f| now < f.retry_at).map(|f| f.message.clone())
    }

    /// Records a write of deployment `key`'s objects to `cluster`: refused with `refusal`, or
    /// through (`None`); a refusal waits [`retry_after`] from `now`, at most `cap`.
    pub(crate) fn record(
        &self,
        key: &str,
        cluster: &str,
        refusal: Option<&str>,
        now: Instant,
        cap: Duration,
    ) -> Streak {
        let mut failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        let before = failing.get(key).and_then(|m| m.get(cluster)).map_or(0, |f| f.streak);
        let Some(message) = refusal else {
            if let Some(members) = failing.get_mut(key) {
                members.remove(cluster);
                if members.is_empty() {
                    failing.remove(key);
                }
            }
            return Streak { now: 0, before };
        };
        let streak = before.saturating_add(1);
        let entry = Failing { streak, message: message.to_string(), retry_at: now + retry_after(streak, cap) };
        failing.entry(key.to_string()).or_default().insert(cluster.to_string(), entry);
        Streak { now: streak, before }
    }

    /// Forgets deployment `key` on every member but those it still writes to (`keep`); all of
    /// them when it is deleted.
    pub(crate) fn keep_only<'a>(&self, key: &str, keep: impl IntoIterator<Item = &'a String>) {
        let mut failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(members) = failing.get_mut(key) else { return };
        let keep: Vec<&String> = keep.into_iter().collect();
        members.retain(|cluster, _| keep.contains(&cluster));
        if members.is_empty() {
            failing.remove(key);
        }
    }
}

/// The wait before the next write after `streak` refused ones in a row (at least 1): 2 s,
/// doubling with each, at most `cap`.
pub(crate) fn retry_after(streak: u32, cap: Duration) -> Duration {
    let doublings = streak.saturating_sub(1).min(20);
    FIRST.saturating_mul(1 << doublings).min(cap.max(FIRST))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_secs(120);

    #[test]
    fn the_wait_doubles_with_each_refusal_in_a_row_up_to_the_cap() {
        let waits: Vec<u64> = (1..=9).map(|s| retry_after(s, CAP).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 120, 120, 120]);
        assert_eq!(retry_after(u32::MAX, CAP), CAP, "no overflow, however long it lasts");
        assert_eq!(retry_after(1, Duration::from_secs(1)), FIRST, "never sooner than the converging requeue");
    }

    #[test]
    fn only_the_refusing_member_waits_and_a_write_that_goes_through_ends_it() {
        let f = ApplyFailures::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(f.waiting("ml/a", "us1", t0), None, "nothing failed yet");
        assert_eq!(f.record("ml/a", "us1", Some("denied"), t0, CAP), Streak { now: 1, before: 0 });
        assert_eq!(f.waiting("ml/a", "us1", at(1)).as_deref(), Some("denied"), "waits 2 s, keeping the refusal");
        assert_eq!(f.waiting("ml/a", "eu1", at(1)), None, "another member of the deployment does not wait");
        assert_eq!(f.waiting("ml/b", "us1", at(1)), None, "another deployment on the member does not wait");
        assert_eq!(f.waiting("ml/a", "us1", at(2)), None, "tried again after 2 s");
        assert_eq!(f.record("ml/a", "us1", Some("denied"), at(2), CAP), Streak { now: 2, before: 1 });
        assert!(f.waiting("ml/a", "us1", at(5)).is_some() && f.waiting("ml/a", "us1", at(6)).is_none(), "then 4 s");
        assert_eq!(f.record("ml/a", "us1", None, at(6), CAP), Streak { now: 0, before: 2 });
        assert_eq!(f.waiting("ml/a", "us1", at(6)), None, "through: no more waiting");
        assert_eq!(f.record("ml/a", "us1", Some("denied"), at(7), CAP), Streak { now: 1, before: 0 }, "a new streak");
    }

    #[test]
    fn a_member_the_deployment_left_or_a_deleted_deployment_is_forgotten() {
        let f = ApplyFailures::default();
        let t0 = Instant::now();
        f.record("ml/a", "us1", Some("denied"), t0, CAP);
        f.record("ml/a", "eu1", Some("denied"), t0, CAP);
        f.record("ml/b", "us1", Some("denied"), t0, CAP);
        f.keep_only("ml/a", &["eu1".to_string()]);
        assert!(f.waiting("ml/a", "us1", t0).is_none() && f.waiting("ml/a", "eu1", t0).is_some());
        f.keep_only("ml/a", &[]);
        assert!(f.waiting("ml/a", "eu1", t0).is_none());
        assert!(f.waiting("ml/b", "us1", t0).is_some(), "another deployment's entry stays");
    }
}
