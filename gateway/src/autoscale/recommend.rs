//! The autoscaler's decision, as a pure function: a deployment's `spec.autoscaling`, its current
//! replica count, the fleet-wide demand its engines report and what was recommended before go
//! in; the count to write and why come out. The rule is the HPA's: each target asks for
//! `ceil(demand / target)` replicas unless demand is within 10 % of what the current count
//! carries, the largest ask wins, stabilisation windows take the lowest (up) or highest (down)
//! recent ask, step policies bound the move, and the result stays within `[min, max]`. With
//! `minReplicas: 0`, no queued or running request for the idle window takes it to zero.

use std::collections::VecDeque;

use flotilla_apis::autoscaling::{Autoscaling, AutoscalingReason, ScalingPolicyType, ScalingRules, SelectPolicy};

/// Demand within this share of what the current count carries leaves the count alone.
pub const TOLERANCE: f64 = 0.1;
/// Idle window when `idleWindowSeconds` is absent.
pub const DEFAULT_IDLE_SECONDS: i32 = 300;
/// Largest count any target may ask for (keeps the arithmetic in range).
const CEILING: f64 = 1_000_000.0;

/// What the engines of one deployment report, summed over the fleet.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Signal {
    /// Requests waiting.
    pub queued: f64,
    /// Requests being served.
    pub running: f64,
    /// Mean KV-cache use of the reporting engines, 0 to 1.
    pub kv_cache: Option<f64>,
}

/// One decision's input.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The deployment's `spec.autoscaling`.
    pub spec: &'a Autoscaling,
    /// `spec.replicas` now.
    pub current: i32,
    /// Demand; `None` when no engine of the deployment reported.
    pub signal: Option<Signal>,
    /// Something other than requests says the deployment is in use: replicas still starting,
    /// or the count changed by someone else (an activation from zero, `kubectl scale`).
    pub busy: bool,
    /// Milliseconds on a monotonic clock.
    pub now: u64,
}

/// What the decisions before this one left behind, per deployment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Memory {
    /// Recent raw recommendations `(at, replicas)`, for the stabilisation windows.
    recs: VecDeque<(u64, i32)>,
    /// Recent changes `(at, delta)`, for the step policies.
    changes: VecDeque<(u64, i32)>,
    /// When demand (or a start, or someone else's change) was last seen.
    active_at: Option<u64>,
}

impl Memory {
    /// Milliseconds since the deployment was last seen in use, at `now`.
    pub fn idle_for(&self, now: u64) -> u64 {
        self.active_at.map_or(0, |t| now.saturating_sub(t))
    }
}

/// The count to write and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The count (equal to the input's `current` when nothing is to be written).
    pub replicas: i32,
    /// What demand alone asked for, before windows, policies and limits.
    pub raw: i32,
    /// Why.
    pub reason: AutoscalingReason,
    /// The numbers behind it.
    pub message: String,
}

/// One direction's rules with the HPA's defaults filled in; periods and windows in ms.
#[derive(Clone, Debug, PartialEq)]
struct Rules {
    window: u64,
    select: SelectPolicy,
    policies: Vec<(ScalingPolicyType, i32, u64)>,
}

fn rules(given: Option<&ScalingRules>, up: bool) -> Rules {
    let default_window = if up { 0 } else { 300 };
    let default_policies = if up {
        vec![(ScalingPolicyType::Percent, 100, 15_000), (ScalingPolicyType::Replicas, 4, 15_000)]
    } else {
        vec![(ScalingPolicyType::Percent, 100, 15_000)]
    };
    let window = given.and_then(|r| r.stabilization_window_seconds).unwrap_or(default_window).max(0) as u64 * 1000;
    let select = given.and_then(|r| r.select_policy).unwrap_or_default();
    let policies = match given.map(|r| &r.policies) {
        Some(p) if !p.is_empty() => {
            p.iter().map(|p| (p.type_, p.value.max(1), p.period_seconds.max(1) as u64 * 1000)).collect()
        }
        _ => default_policies,
    };
    Rules { window, select, policies }
}

/// What one target asks for: `ideal` replicas' worth of demand, kept at `current` when within
/// the tolerance of it.
fn ask(ideal: f64, current: i32) -> i32 {
    let ideal = if ideal.is_finite() { ideal.clamp(0.0, CEILING) } else { 0.0 };
    if current > 0 && (ideal / f64::from(current) - 1.0).abs() <= TOLERANCE {
        return current;
    }
    ideal.ceil() as i32
}

/// The raw recommendation: the largest ask of the configured targets, and how each was made.
fn raw(spec: &Autoscaling, current: i32, s: &Signal) -> (i32, Vec<String>) {
    let mut asks = Vec::new();
    let t = &spec.target;
    if let Some(q) = t.queued_per_replica {
        let n = ask(s.queued / f64::from(q.max(1)), current);
        asks.push((n, format!("{} queued for {q} per replica: {n}", s.queued)));
    }
    if let Some(r) = t.running_per_replica {
        let n = ask(s.running / f64::from(r.max(1)), current);
        asks.push((n, format!("{} running for {r} per replica: {n}", s.running)));
    }
    if let (Some(k), Some(used)) = (t.kv_cache_percent, s.kv_cache) {
        let n = ask(f64::from(current) * used * 100.0 / f64::from(k.max(1)), current);
        asks.push((n, format!("KV cache {:.0}% for {k}%: {n}", used * 100.0)));
    }
    let n = asks.iter().map(|(n, _)| *n).max().unwrap_or(current);
    (n, asks.into_iter().map(|(_, m)| m).collect())
}

fn moved(changes: &VecDeque<(u64, i32)>, period: u64, now: u64) -> (i32, i32) {
    changes
        .iter()
        .filter(|(at, _)| at + period > now)
        .fold((0, 0), |(up, down), (_, d)| if *d > 0 { (up + d, down) } else { (up, down - d) })
}

/// The most the count may reach now going up.
fn up_limit(current: i32, changes: &VecDeque<(u64, i32)>, r: &Rules, now: u64) -> i32 {
    if r.select == SelectPolicy::Disabled {
        return current;
    }
    let proposals = r.policies.iter().map(|(kind, value, period)| {
        let (added, removed) = moved(changes, *period, now);
        let start = (current - added + removed).max(0);
        match kind {
            ScalingPolicyType::Replicas => start.saturating_add(*value),
            // From zero a percentage is of one replica.
            ScalingPolicyType::Percent => {
                (f64::from(start.max(1)) * (1.0 + f64::from(*value) / 100.0)).ceil().min(CEILING) as i32
            }
        }
    });
    let limit = match r.select {
        SelectPolicy::Min => proposals.min(),
        _ => proposals.max(),
    };
    limit.unwrap_or(current).max(current)
}

/// The least the count may reach now going down.
fn down_limit(current: i32, changes: &VecDeque<(u64, i32)>, r: &Rules, now: u64) -> i32 {
    if r.select == SelectPolicy::Disabled {
        return current;
    }
    let proposals = r.policies.iter().map(|(kind, value, period)| {
        let (added, removed) = moved(changes, *period, now);
        let start = (current + removed - added).max(0);
        match kind {
            ScalingPolicyType::Replicas => start - value,
            ScalingPolicyType::Percent => (f64::from(start) * (1.0 - f64::from(*value) / 100.0)).floor() as i32,
        }
    });
    let limit = match r.select {
        SelectPolicy::Min => proposals.max(),
        _ => proposals.min(),
    };
    limit.unwrap_or(current).max(0).min(current)
}

/// The decision for `input`, and the memory to pass to the next one.
pub fn recommend(input: &Input<'_>, memory: &Memory) -> (Decision, Memory) {
    let spec = input.spec;
    let (min, max) = (spec.min_replicas.max(0), spec.max_replicas.max(1).max(spec.min_replicas));
    let (current, now) = (input.current.max(0), input.now);
    let (up, down) = (
        rules(spec.behavior.as_ref().and_then(|b| b.scale_up.as_ref()), true),
        rules(spec.behavior.as_ref().and_then(|b| b.scale_down.as_ref()), false),
    );
    let mut m = memory.clone();
    let in_use = input.busy || input.signal.is_some_and(|s| s.queued > 0.0 || s.running > 0.0);
    // A deployment first seen (a new leader) counts as in use: it is never taken to zero at once.
    if in_use || m.active_at.is_none() {
        m.active_at = Some(now);
    }
    let keep = up.window.max(down.window);
    m.recs.retain(|(at, _)| at + keep >= now);
    let period = up.policies.iter().chain(&down.policies).map(|p| p.2).max().unwrap_or(0);
    m.changes.retain(|(at, _)| at + period > now);

    let idle_ms = u64::from(spec.idle_window_seconds.unwrap_or(DEFAULT_IDLE_SECONDS).max(1).unsigned_abs()) * 1000;
    let idle = m.idle_for(now);
    let Some(signal) = input.signal else {
        let replicas = current.clamp(min, max);
        let (reason, message) = if current == 0 && min == 0 {
            (AutoscalingReason::ScaledToZero, "at zero replicas; the first request activates one".to_string())
        } else {
            (
                AutoscalingReason::NoMetrics,
                "no engine of this deployment reported metrics to the gateway: the count stays".to_string(),
            )
        };
        let replicas = if current == 0 && min == 0 { 0 } else { replicas };
        return finish(m, input, replicas, current, reason, message);
    };
    let (mut want, asks) = raw(spec, current, &signal);
    let asked = asks.join("; ");
    if min == 0 && want == 0 {
        if idle >= idle_ms || current == 0 {
            // The idle window is the stabilisation for zero: no further window applies.
            m.recs.push_back((now, 0));
            let message = format!("no queued or running request for the idle window ({} s)", idle_ms / 1000);
            return finish(m, input, 0, 0, AutoscalingReason::ScaledToZero, message);
        }
        want = 1;
    }
    m.recs.push_back((now, want));
    let lowest = m.recs.iter().filter(|(at, _)| at + up.window >= now).map(|r| r.1).min().unwrap_or(want);
    let highest = m.recs.iter().filter(|(at, _)| at + down.window >= now).map(|r| r.1).max().unwrap_or(want);
    let mut stabilized = current;
    if stabilized < lowest {
        stabilized = lowest;
    }
    if stabilized > highest {
        stabilized = highest;
    }
    let limited = if stabilized > current {
        stabilized.min(up_limit(current, &m.changes, &up, now))
    } else if stabilized < current {
        stabilized.max(down_limit(current, &m.changes, &down, now))
    } else {
        current
    };
    let replicas = limited.clamp(min.max(1), max);
    let reason = if limited != stabilized && replicas == limited {
        AutoscalingReason::ScalingLimited
    } else if want > max && replicas == max {
        AutoscalingReason::AtMaximum
    } else if want < min && replicas == min {
        AutoscalingReason::AtMinimum
    } else if stabilized != want && replicas == stabilized {
        AutoscalingReason::Stabilizing
    } else if replicas > current {
        AutoscalingReason::ScaledUp
    } else if replicas < current {
        AutoscalingReason::ScaledDown
    } else {
        AutoscalingReason::Steady
    };
    let idle_note =
        if min == 0 { format!("; to zero after {} s without requests", idle_ms / 1000) } else { String::new() };
    let message = format!("{asked}; want {want}, {current} replicas now (min {min}, max {max}){idle_note}");
    finish(m, input, replicas, want, reason, message)
}

fn finish(
    mut m: Memory,
    input: &Input<'_>,
    replicas: i32,
    raw: i32,
    reason: AutoscalingReason,
    message: String,
) -> (Decision, Memory) {
    let delta = replicas - input.current.max(0);
    if delta != 0 {
        m.changes.push_back((input.now, delta));
    }
    (Decision { replicas, raw, reason, message }, m)
}

#[cfg(test)]
#[path = "recommend_tests.rs"]
mod tests;
