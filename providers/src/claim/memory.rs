//! What the engine remembers between reconciles, read back from the claim's own
//! `status.attempts` so that nothing lives only in memory: which (region, class, capacity
//! type) keys failed recently and how often in a row, giving each a cool-down (3 minutes,
//! doubling per consecutive failure, capped), and how long to back off after transient
//! provider failures.

use std::time::Duration;

use flotilla_apis::claim::ClaimAttempt;
use flotilla_apis::common::CapacityType;
use k8s_openapi::jiff::Timestamp;

use crate::clock::add;
use crate::error::ErrorKind;

/// Results that mean "this offering gave nothing; don't ask again for a while".
const UNAVAILABLE: [&str; 7] = [
    "InsufficientCapacity",
    "InvalidRequest",
    "CapacityTypeUnavailable",
    "QuotaExceeded",
    "ReservationMismatch",
    "Interrupted",
    NO_OFFERING,
];
/// Result recorded when a region lists no offering for a (class, capacity type).
pub const NO_OFFERING: &str = "NoOffering";
/// Results that mean the offering worked.
const OBTAINED: [&str; 2] = ["Fulfilled", "PartiallyFulfilled"];

/// The key the engine remembers failures under.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OfferingKey {
    /// Region.
    pub region: String,
    /// InferenceClass (or instance type for selector-only alternatives).
    pub class: String,
    /// Capacity type.
    pub capacity_type: CapacityType,
}

impl OfferingKey {
    fn matches(&self, a: &ClaimAttempt) -> bool {
        a.region == self.region && a.class == self.class && a.capacity_type == Some(self.capacity_type)
    }
}

/// When `key` may be tried again, if it is cooling down at all.
pub fn cooling_until(attempts: &[ClaimAttempt], key: &OfferingKey, base: Duration, cap: Duration) -> Option<Timestamp> {
    let mut failures = 0u32;
    let mut last: Option<Timestamp> = None;
    for attempt in attempts.iter().rev().filter(|a| key.matches(a)) {
        if OBTAINED.contains(&attempt.result.as_str()) {
            break;
        }
        if UNAVAILABLE.contains(&attempt.result.as_str()) {
            failures += 1;
            if last.is_none() {
                last = attempt.time.as_ref().map(|t| t.0);
            }
        }
    }
    let last = last?;
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    Some(add(last, base.saturating_mul(factor).min(cap)))
}

/// Every key cooling down at `now`, in order of first appearance in `attempts`, with when it
/// may be tried again and its newest failure.
pub fn cooling(
    attempts: &[ClaimAttempt],
    now: Timestamp,
    base: Duration,
    cap: Duration,
) -> Vec<(OfferingKey, Timestamp, &ClaimAttempt)> {
    let mut out: Vec<(OfferingKey, Timestamp, &ClaimAttempt)> = Vec::new();
    for a in attempts {
        let Some(capacity_type) = a.capacity_type else { continue };
        let key = OfferingKey { region: a.region.clone(), class: a.class.clone(), capacity_type };
        if out.iter().any(|(k, _, _)| *k == key) {
            continue;
        }
        let Some(until) = cooling_until(attempts, &key, base, cap).filter(|u| *u > now) else { continue };
        if let Some(last) = attempts.iter().rev().find(|x| key.matches(x) && UNAVAILABLE.contains(&x.result.as_str())) {
            out.push((key, until, last));
        }
    }
    out
}

/// How long to wait after the newest run of transient failures (throttling, outages), if the
/// newest attempt was one: 5 s doubling per consecutive transient attempt, capped.
pub fn transient_backoff(attempts: &[ClaimAttempt], cap: Duration) -> Option<Duration> {
    let transient = |a: &&ClaimAttempt| {
        [ErrorKind::Throttled.as_str(), ErrorKind::Unavailable.as_str()].contains(&a.result.as_str())
    };
    let run = attempts.iter().rev().take_while(transient).count();
    if run == 0 {
        return None;
    }
    let factor = 2u32.saturating_pow(u32::try_from(run - 1).unwrap_or(16).min(16));
    Some(Duration::from_secs(5).saturating_mul(factor).min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn attempt(secs: i64, result: &str) -> ClaimAttempt {
        ClaimAttempt {
            time: Timestamp::from_second(secs).ok().map(Time),
            provider: "sim".into(),
            region: "r".into(),
            class: "c".into(),
            capacity_type: Some(CapacityType::Spot),
            result: result.into(),
            message: String::new(),
        }
    }

    fn key() -> OfferingKey {
        OfferingKey { region: "r".into(), class: "c".into(), capacity_type: CapacityType::Spot }
    }

    #[test]
    fn cool_down_doubles_per_consecutive_failure_and_resets_on_success() {
        let (base, cap) = (Duration::from_secs(180), Duration::from_secs(1800));
        let one = [attempt(0, "InsufficientCapacity")];
        assert_eq!(cooling_until(&one, &key(), base, cap), Timestamp::from_second(180).ok());
        let two = [attempt(0, "InsufficientCapacity"), attempt(200, "QuotaExceeded")];
        assert_eq!(cooling_until(&two, &key(), base, cap), Timestamp::from_second(200 + 360).ok());
        let reset = [attempt(0, "InsufficientCapacity"), attempt(100, "Fulfilled")];
        assert_eq!(cooling_until(&reset, &key(), base, cap), None);
        let many: Vec<_> = (0..10).map(|i| attempt(i, "InsufficientCapacity")).collect();
        assert_eq!(cooling_until(&many, &key(), base, cap), Timestamp::from_second(9 + 1800).ok());
    }

    #[test]
    fn transient_backoff_grows_and_stops_at_other_results() {
        let cap = Duration::from_secs(300);
        assert_eq!(transient_backoff(&[attempt(0, "Throttled")], cap), Some(Duration::from_secs(5)));
        assert_eq!(
            transient_backoff(&[attempt(0, "Throttled"), attempt(1, "Unavailable")], cap),
            Some(Duration::from_secs(10))
        );
        assert_eq!(transient_backoff(&[attempt(0, "Throttled"), attempt(1, "Fulfilled")], cap), None);
    }
}
