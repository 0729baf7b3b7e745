//! Merging freshly computed conditions into the ones already in status. A condition keeps its
//! `lastTransitionTime` unless its status flips, so that `kubectl get` shows when something
//! actually changed, and a reconcile that computes the same conditions writes nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The three statuses a condition can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl Status {
    /// As written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    /// `True` when `ok`, else `False`.
    pub fn from_bool(ok: bool) -> Self {
        if ok { Self::True } else { Self::False }
    }
}

/// A condition as a reconciler computes it: no timestamps, no generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// Condition type (a `constants::condition` value).
    pub type_: &'static str,
    /// Its status.
    pub status: Status,
    /// CamelCase reason (a `constants::reason` value).
    pub reason: &'static str,
    /// What is so, and what to change when it is not as wanted. Never empty.
    pub message: String,
}

impl Desired {
    /// A desired condition.
    pub fn new(type_: &'static str, status: Status, reason: &'static str, message: impl Into<String>) -> Self {
        Self { type_, status, reason, message: message.into() }
    }
}

/// Merges `desired` into `current` and returns the new list.
///
/// Conditions of types not in `desired` are kept as they are. A desired condition whose
/// status equals the current one keeps the current `lastTransitionTime`; otherwise it gets
/// `now`. `observedGeneration` is set on every merged condition. The order is the current
/// order, with new types appended in the order given.
pub fn merge(
    current: &[Condition],
    desired: &[Desired],
    observed_generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = current.to_vec();
    for want in desired {
        let message = if want.message.is_empty() { want.reason.to_string() } else { want.message.clone() };
        match out.iter_mut().find(|c| c.type_ == want.type_) {
            Some(existing) => {
                if existing.status != want.status.as_str() {
                    existing.last_transition_time = now.clone();
                    existing.status = want.status.as_str().to_string();
                }
                existing.reason = want.reason.to_string();
                existing.message = message;
                existing.observed_generation = observed_generation;
            }
            None => out.push(Condition {
                type_: want.type_.to_string(),
                status: want.status.as_str().to_string(),
                reason: want.reason.to_string(),
                message,
                observed_generation,
                last_transition_time: now.clone(),
            }),
        }
    }
    out
}

/// Whether merging `desired` would change anything in `current` (so a write is needed).
pub fn would_change(current: &[Condition], desired: &[Desired], observed_generation: Option<i64>) -> bool {
    desired.iter().any(|want| match current.iter().find(|c| c.type_ == want.type_) {
        None => true,
        Some(c) => {
            c.status != want.status.as_str()
                || c.reason != want.reason
                || (c.message != want.message && !want.message.is_empty())
                || c.observed_generation != observed_generation
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn ready(status: Status, reason: &'static str) -> Desired {
        Desired::new("Ready", status, reason, "msg")
    }

    #[test]
    fn new_condition_gets_now() {
        let merged = merge(&[], &[ready(Status::True, "AsExpected")], Some(3), &at(100));
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].last_transition_time, at(100));
        assert_eq!(merged[0].observed_generation, Some(3));
        assert_eq!(merged[0].status, "True");
    }

    #[test]
    fn same_status_keeps_transition_time_but_updates_reason_and_message() {
        let first = merge(&[], &[ready(Status::False, "Pending")], Some(1), &at(100));
        let second = merge(&first, &[Desired::new("Ready", Status::False, "Unreachable", "down")], Some(2), &at(200));
        assert_eq!(second[0].last_transition_time, at(100), "no flip, no new transition time");
        assert_eq!(second[0].reason, "Unreachable");
        assert_eq!(second[0].message, "down");
        assert_eq!(second[0].observed_generation, Some(2));
    }

    #[test]
    fn flip_sets_new_transition_time() {
        let first = merge(&[], &[ready(Status::False, "Pending")], Some(1), &at(100));
        let second = merge(&first, &[ready(Status::True, "AsExpected")], Some(1), &at(200));
        assert_eq!(second[0].last_transition_time, at(200));
        assert_eq!(second[0].status, "True");
    }

    #[test]
    fn other_types_are_untouched_and_order_is_stable() {
        let first = merge(
            &[],
            &[Desired::new("Reachable", Status::True, "AsExpected", "ok"), ready(Status::True, "AsExpected")],
            Some(1),
            &at(100),
        );
        let second = merge(&first, &[ready(Status::False, "Unreachable")], Some(1), &at(200));
        assert_eq!(second.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(), ["Reachable", "Ready"]);
        assert_eq!(second[0], first[0]);
    }

    #[test]
    fn empty_message_is_replaced_by_reason() {
        let merged = merge(&[], &[Desired::new("Ready", Status::True, "AsExpected", "")], None, &at(1));
        assert_eq!(merged[0].message, "AsExpected");
    }

    #[test]
    fn would_change_only_when_something_differs() {
        let d = [ready(Status::True, "AsExpected")];
        let merged = merge(&[], &d, Some(1), &at(1));
        assert!(!would_change(&merged, &d, Some(1)));
        assert!(would_change(&merged, &d, Some(2)), "new generation");
        assert!(would_change(&merged, &[ready(Status::False, "AsExpected")], Some(1)));
        assert!(would_change(&merged, &[ready(Status::True, "Other")], Some(1)));
        assert!(would_change(&[], &d, Some(1)));
    }
}
