//! Turns the outcome of a step into the claim's status: allocations, bounded attempts,
//! device totals and the `Fulfilled`, `Provisioning` and `Ready` conditions with a reason from
//! `apis::constants::reason` and a message saying what was tried and what to change. Only
//! inputs go into the text (no wall clock, no map iteration order), so an unchanged claim
//! gets byte-identical status and the controller writes nothing.

use std::time::Duration;

use flotilla_apis::claim::CapacityClaimStatus;
use flotilla_apis::conditions::{Desired, Status, merge};
use flotilla_apis::constants::{condition, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::memory::cooling;
use super::run::Run;
use super::{ClaimEngine, ClaimInput, ClaimStep};
use crate::error::ProviderError;

/// How a step ended.
pub(super) enum Outcome {
    Invalid(String),
    NoAllowedRegion(String),
    Interrupted,
    Expired { latency: Duration, since: k8s_openapi::jiff::Timestamp },
    Transient(ProviderError),
    Fatal(ProviderError),
    Short,
    Provisioning,
    Fulfilled,
}

fn secs(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

/// The failures behind the current state: the newest failure of each offering still cooling
/// down. Derived from the attempts alone, so a step that asked nothing says the same as the
/// step that asked.
fn failures(run: &Run, settings: &super::EngineSettings) -> Vec<(String, String)> {
    cooling(&run.attempts, run.now, settings.unavailable_for, settings.unavailable_cap)
        .into_iter()
        .map(|(key, until, a)| {
            (
                a.result.clone(),
                format!(
                    "{} {} in {}: {} ({}), not asked again before {until}",
                    key.capacity_type, key.class, key.region, a.result, a.message
                ),
            )
        })
        .collect()
}

/// The newest failure of every offering ever refused, without cool-down times (for claims
/// that stopped asking).
fn last_failures(run: &Run) -> String {
    let mut seen: Vec<(&str, &str, Option<flotilla_apis::common::CapacityType>)> = Vec::new();
    let mut out = Vec::new();
    for a in run.attempts.iter().rev() {
        let key = (a.region.as_str(), a.class.as_str(), a.capacity_type);
        if seen.contains(&key) || ["Fulfilled", "PartiallyFulfilled"].contains(&a.result.as_str()) {
            continue;
        }
        seen.push(key);
        let ct = a.capacity_type.map(|c| c.as_str()).unwrap_or("-");
        out.push(format!("{ct} {} in {}: {} ({})", a.class, a.region, a.result, a.message));
    }
    out.reverse();
    if out.is_empty() { "none recorded".to_string() } else { out.join("; ") }
}

fn short_reason(failures: &[(String, String)]) -> &'static str {
    let has = |r: &str| failures.iter().any(|(x, _)| x == r);
    let only = |r: &str| failures.iter().all(|(x, _)| x == r || x == super::memory::NO_OFFERING);
    if has("Unauthorized") {
        reason::PROVIDER_UNAUTHORIZED
    } else if has("ReservationMismatch") && only("ReservationMismatch") {
        reason::RESERVATION_MISMATCH
    } else if has("QuotaExceeded") && only("QuotaExceeded") {
        reason::QUOTA_EXCEEDED
    } else if has("InvalidRequest") && only("InvalidRequest") {
        reason::PROVIDER_REJECTED
    } else {
        reason::CAPACITY_UNAVAILABLE
    }
}

pub(super) fn finish(
    engine: &ClaimEngine,
    input: &ClaimInput<'_>,
    mut run: Run,
    outcome: Outcome,
    requeue_after: Duration,
) -> ClaimStep {
    let spec = input.spec;
    let dpp =
        |pod_set: &str| i64::from(spec.pod_sets.iter().find(|p| p.name == pod_set).map_or(0, |p| p.devices_per_pod));
    let requested: i64 = spec.pod_sets.iter().map(|p| i64::from(p.count) * i64::from(p.devices_per_pod)).sum();
    let obtained: i64 = run.allocations.iter().map(|a| i64::from(a.pods) * dpp(&a.pod_set)).sum();
    let per_set = spec
        .pod_sets
        .iter()
        .map(|p| format!("{} {} of {} pods", p.name, run.pods(&p.name), p.count))
        .collect::<Vec<_>>()
        .join(", ");
    let holding = run
        .allocations
        .iter()
        .map(|a| {
            let ct = a.capacity_type.map(|c| c.as_str()).unwrap_or("-");
            format!("{} node(s) {ct} {} in {} ({}) for {}", a.nodes, a.class, a.cluster, a.pool, a.pod_set)
        })
        .collect::<Vec<_>>()
        .join("; ");
    let fails = failures(&run, &engine.settings);
    let tried = if fails.is_empty() {
        "nothing was refused".to_string()
    } else {
        fails.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>().join("; ")
    };
    let widen = "To get the rest: allow more regions or jurisdictions (spec.capacity.sovereignty), capacity types \
                 or device classes, ask the provider for more quota, or lower the pod count.";
    let got = format!("Obtained {obtained} of {requested} devices ({per_set}).");

    let first_ct = spec.capacity.capacity_types.first().copied();
    let first_class = spec.capacity.device_classes.first().and_then(|c| c.class.clone());
    let fallback = run
        .allocations
        .iter()
        .any(|a| a.capacity_type != first_ct || first_class.as_ref().is_some_and(|c| *c != a.class));

    let (fulfilled, why, message) = match &outcome {
        Outcome::Invalid(m) => (false, reason::INVALID_SPEC, format!("{m}. Nothing was requested from the provider.")),
        Outcome::NoAllowedRegion(offered) => (
            false,
            reason::NO_ALLOWED_REGION,
            format!(
                "Provider {} offers only {offered}, and spec.capacity.sovereignty allows none of them; nothing was \
                 requested. Allow one of these regions or jurisdictions, or use a provider with an allowed region.",
                run.provider
            ),
        ),
        Outcome::Interrupted => (
            false,
            reason::INTERRUPTED,
            format!(
                "The provider took capacity back: {}. Released it and re-acquiring; the interrupted offering is \
                 skipped for {}. To avoid this, prefer on-demand or reserved in spec.capacity.capacityTypes.",
                run.interrupted.join("; "),
                secs(engine.settings.unavailable_for)
            ),
        ),
        Outcome::Expired { latency, since } => (
            false,
            reason::EXPIRED,
            format!(
                "Not fulfilled within maxProvisioningLatency {} (counted from {since}). {got} Last refusals: {}. No more \
                 capacity is requested; raise spec.latency.maxProvisioningLatency or widen the claim and recreate it.",
                secs(*latency),
                last_failures(&run)
            ),
        ),
        Outcome::Transient(e) => (
            false,
            reason::PROVIDER_UNAVAILABLE,
            format!(
                "Provider {} did not answer ({}: {}); retrying in {}. {got}",
                run.provider,
                e.code(),
                e.message(),
                secs(requeue_after)
            ),
        ),
        Outcome::Fatal(e) => (
            false,
            e.kind().claim_reason(),
            format!(
                "Provider {} refused the request ({}: {}). Fix the controller's provider credentials or \
                 permissions; {got}",
                run.provider,
                e.code(),
                e.message()
            ),
        ),
        Outcome::Short if obtained > 0 => {
            (false, reason::PARTIALLY_FULFILLED, format!("{got} Holding: {holding}. Refused: {tried}. {widen}"))
        }
        Outcome::Short => (false, short_reason(&fails), format!("{got} Refused: {tried}. {widen}")),
        Outcome::Provisioning => (
            false,
            reason::PROVISIONING,
            format!("Every pod set has nodes coming; waiting for them to be ready: {holding}."),
        ),
        Outcome::Fulfilled if fallback => (
            true,
            reason::CLAIM_FALLBACK_SELECTED,
            format!(
                "Fulfilled with a fallback: {holding}. The first choice ({} {}) was not obtained: {}.",
                first_ct.map(|c| c.as_str()).unwrap_or("-"),
                first_class.as_deref().unwrap_or("alternative-1"),
                last_failures(&run)
            ),
        ),
        Outcome::Fulfilled => (true, reason::FULFILLED, format!("Fulfilled: {holding}.")),
    };
    let message = if run.released.is_empty() {
        message
    } else {
        run.released.sort();
        format!("{message} Gone since the last look: {}.", run.released.join("; "))
    };
    let provisioning = if run.provisioning {
        Desired::new(
            condition::PROVISIONING,
            Status::True,
            reason::PROVISIONING,
            format!("Nodes are coming: {holding}."),
        )
    } else {
        Desired::new(condition::PROVISIONING, Status::False, why, "No provider request is in flight.")
    };
    let desired = [
        Desired::new(condition::FULFILLED, Status::from_bool(fulfilled), why, message.clone()),
        provisioning,
        Desired::new(condition::READY, Status::from_bool(fulfilled), why, message),
        surplus(&run.surplus),
    ];
    let excess = run.attempts.len().saturating_sub(engine.settings.max_attempts);
    run.attempts.drain(..excess);
    let status = CapacityClaimStatus {
        observed_generation: input.generation,
        conditions: flotilla_apis::Conditions(merge(
            &input.status.conditions.0,
            &desired,
            input.generation,
            &Time(input.now),
        )),
        devices_requested: requested,
        devices_obtained: obtained,
        allocations: run.allocations,
        attempts: run.attempts,
    };
    let changed = status != *input.status;
    ClaimStep { status, changed, requeue_after, acquisitions: run.acquisitions }
}

/// The `Surplus` condition: the strongest hold first (a drain the application owes, then a
/// policy hold, then what is being given back), every entry in the message.
pub(super) fn surplus(held: &[super::disrupt::Held]) -> Desired {
    if held.is_empty() {
        return Desired::new(
            condition::SURPLUS,
            Status::False,
            reason::AS_EXPECTED,
            "Holds no more nodes than the pod sets need.",
        );
    }
    let why = [reason::DRAIN_REQUIRED, reason::CONSOLIDATION_BLOCKED, reason::SCALING_DOWN]
        .into_iter()
        .find(|r| held.iter().any(|(x, _)| x == r))
        .unwrap_or(reason::SCALING_DOWN);
    let text = held.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>().join("; ");
    Desired::new(condition::SURPLUS, Status::True, why, format!("{text}."))
}
