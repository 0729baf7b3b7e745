//! The recommender's rules one by one (targets, tolerance, windows, steps, limits, the idle
//! window) and its invariants over arbitrary specs and signals (never outside `[min, max]`,
//! zero only after the idle window, no flapping under a steady signal with noise).

use proptest::prelude::*;

use super::*;

fn spec(v: serde_json::Value) -> Autoscaling {
    serde_json::from_value(v).unwrap()
}

fn running(n: f64) -> Option<Signal> {
    Some(Signal { running: n, ..Signal::default() })
}

/// Runs decisions every `step` ms from `start`, applying each, for the signals given.
fn run(s: &Autoscaling, mut current: i32, signals: &[Option<Signal>], step: u64) -> (Vec<i32>, Vec<Decision>) {
    let mut memory = Memory::default();
    let (mut counts, mut decisions) = (Vec::new(), Vec::new());
    for (i, signal) in signals.iter().enumerate() {
        let input = Input { spec: s, current, signal: *signal, busy: false, now: 1_000_000 + i as u64 * step };
        let (d, m) = recommend(&input, &memory);
        memory = m;
        current = d.replicas;
        counts.push(current);
        decisions.push(d);
    }
    (counts, decisions)
}

#[test]
fn each_target_asks_for_ceil_of_demand_over_target_and_the_largest_wins() {
    let s = spec(serde_json::json!({"minReplicas": 1, "maxReplicas": 20,
        "target": {"queuedPerReplica": 4, "runningPerReplica": 10}}));
    let input = |sig| Input { spec: &s, current: 2, signal: Some(sig), busy: false, now: 0 };
    let (d, _) = recommend(&input(Signal { queued: 9.0, running: 12.0, kv_cache: None }), &Memory::default());
    assert_eq!(
        (d.raw, d.replicas, d.reason),
        (3, 3, AutoscalingReason::ScaledUp),
        "queued 9/4 → 3 beats running 12/10 → 2"
    );
    assert!(d.message.contains("9 queued for 4 per replica: 3"), "{}", d.message);
    let (d, _) = recommend(&input(Signal { queued: 0.0, running: 55.0, kv_cache: None }), &Memory::default());
    assert_eq!((d.raw, d.replicas), (6, 6), "running 55/10 → 6; +4 or +100 % per 15 s allows 6");
}

#[test]
fn demand_within_ten_percent_keeps_the_count() {
    let s = spec(serde_json::json!({"minReplicas": 1, "maxReplicas": 20, "target": {"runningPerReplica": 10}}));
    for r in [36.5, 40.0, 43.5] {
        let (d, _) =
            recommend(&Input { spec: &s, current: 4, signal: running(r), busy: false, now: 0 }, &Memory::default());
        assert_eq!((d.replicas, d.reason), (4, AutoscalingReason::Steady), "running {r}");
    }
    let (d, _) =
        recommend(&Input { spec: &s, current: 4, signal: running(45.0), busy: false, now: 0 }, &Memory::default());
    assert_eq!(d.replicas, 5, "12.5 % over: up");
}

#[test]
fn kv_cache_use_scales_the_current_count() {
    let s = spec(serde_json::json!({"minReplicas": 1, "maxReplicas": 20, "target": {"kvCachePercent": 50}}));
    let sig = Some(Signal { kv_cache: Some(0.9), ..Signal::default() });
    let (d, _) = recommend(&Input { spec: &s, current: 4, signal: sig, busy: true, now: 0 }, &Memory::default());
    assert_eq!(d.replicas, 8, "4 × 90/50 = 7.2 → 8");
}

#[test]
fn never_above_max_nor_below_min_and_says_so() {
    let s = spec(serde_json::json!({"minReplicas": 2, "maxReplicas": 5, "target": {"runningPerReplica": 1}}));
    let (d, _) =
        recommend(&Input { spec: &s, current: 5, signal: running(50.0), busy: false, now: 0 }, &Memory::default());
    assert_eq!((d.replicas, d.reason), (5, AutoscalingReason::AtMaximum));
    let quick = spec(serde_json::json!({"minReplicas": 2, "maxReplicas": 5, "target": {"runningPerReplica": 1},
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}));
    let (d, _) =
        recommend(&Input { spec: &quick, current: 2, signal: running(0.0), busy: false, now: 0 }, &Memory::default());
    assert_eq!((d.replicas, d.reason), (2, AutoscalingReason::AtMinimum));
    // A hand-set count outside the range is brought into it.
    let (d, _) =
        recommend(&Input { spec: &s, current: 9, signal: running(9.0), busy: false, now: 0 }, &Memory::default());
    assert_eq!(d.replicas, 5);
}

#[test]
fn step_policies_limit_each_period_and_the_rest_follows_later() {
    let s = spec(serde_json::json!({"minReplicas": 1, "maxReplicas": 100, "target": {"runningPerReplica": 1},
        "behavior": {"scaleUp": {"policies": [{"type": "Replicas", "value": 2, "periodSeconds": 60}]}}}));
    // 20 wanted from 1: +2 per minute.
    let (counts, decisions) = run(&s, 1, &vec![running(20.0); 7], 20_000);
    assert_eq!(counts, [3, 3, 3, 5, 5, 5, 7]);
    assert_eq!(decisions[1].reason, AutoscalingReason::ScalingLimited);
    // Percent and Replicas with Max: the larger step; with Min: the smaller.
    let both = |select: &str| {
        spec(serde_json::json!({"minReplicas": 1, "maxReplicas": 100, "target": {"runningPerReplica": 1},
            "behavior": {"scaleUp": {"selectPolicy": select, "policies": [
                {"type": "Replicas", "value": 1, "periodSeconds": 15}, {"type": "Percent", "value": 100, "periodSeconds": 15}]}}}))
    };
    assert_eq!(run(&both("Max"), 4, &[running(20.0)], 1).0, [8]);
    assert_eq!(run(&both("Min"), 4, &[running(20.0)], 1).0, [5]);
    assert_eq!(run(&both("Disabled"), 4, &[running(20.0)], 1).0, [4]);
}

#[test]
fn the_scale_down_window_holds_the_highest_recent_recommendation() {
    let s = spec(serde_json::json!({"minReplicas": 1, "maxReplicas": 20, "target": {"runningPerReplica": 10},
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}}));
    // 80 running for a while, then 20: the count stays at 8 for the window, then drops.
    let mut signals = vec![running(80.0); 3];
    signals.extend(vec![running(20.0); 8]);
    let (counts, decisions) = run(&s, 8, &signals, 15_000);
    assert_eq!(counts, [8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 2]);
    assert_eq!(decisions[4].reason, AutoscalingReason::Stabilizing);
    assert_eq!(decisions[7].reason, AutoscalingReason::ScaledDown);
}

#[test]
fn the_scale_up_window_takes_the_lowest_recent_recommendation() {
    let s = spec(serde_json::json!({"minReplicas": 1, "maxReplicas": 20, "target": {"runningPerReplica": 10},
        "behavior": {"scaleUp": {"stabilizationWindowSeconds": 30}}}));
    // One spike does not scale up; sustained demand does, once the window is full of it.
    let (counts, _) =
        run(&s, 2, &[running(20.0), running(90.0), running(20.0), running(90.0), running(90.0), running(90.0)], 15_000);
    assert_eq!(counts, [2, 2, 2, 2, 2, 6], "then +100 % or +4 per 15 s: 6");
}

#[test]
fn idle_for_the_window_goes_to_zero_and_not_a_moment_before() {
    let s = spec(serde_json::json!({"minReplicas": 0, "maxReplicas": 4, "target": {"runningPerReplica": 10},
        "idleWindowSeconds": 60, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}));
    let mut signals = vec![running(5.0)];
    signals.extend(vec![running(0.0); 6]);
    let (counts, decisions) = run(&s, 1, &signals, 15_000);
    assert_eq!(counts, [1, 1, 1, 1, 0, 0, 0], "zero once 60 s passed since the last request");
    assert!(decisions[2].message.contains("to zero after 60 s without requests"), "{}", decisions[2].message);
    assert_eq!(decisions[4].reason, AutoscalingReason::ScaledToZero);
    // A start in progress (busy) counts as use.
    let mut memory = Memory::default();
    for i in 0..10 {
        let input = Input { spec: &s, current: 1, signal: running(0.0), busy: true, now: i * 15_000 };
        let (d, m) = recommend(&input, &memory);
        memory = m;
        assert_eq!(d.replicas, 1);
    }
    // No metrics at all never takes a deployment to zero.
    let (counts, decisions) = run(&s, 1, &vec![None; 10], 15_000);
    assert_eq!(counts, [1; 10]);
    assert_eq!(decisions[9].reason, AutoscalingReason::NoMetrics);
    // With minReplicas 1 the idle window does nothing.
    let one = spec(serde_json::json!({"minReplicas": 1, "maxReplicas": 4, "target": {"runningPerReplica": 10},
        "idleWindowSeconds": 60}));
    assert_eq!(run(&one, 1, &vec![running(0.0); 10], 15_000).0, [1; 10]);
}

fn arb_rules() -> impl Strategy<Value = serde_json::Value> {
    (0..600i32, 0..3usize, 1..5i32, 1..200i32, 1..120i32).prop_map(|(window, select, kind, value, period)| {
        let select = ["Max", "Min", "Disabled"][select];
        let kind = if kind % 2 == 0 { "Replicas" } else { "Percent" };
        serde_json::json!({"stabilizationWindowSeconds": window, "selectPolicy": select,
            "policies": [{"type": kind, "value": value, "periodSeconds": period}]})
    })
}

fn arb_spec() -> impl Strategy<Value = Autoscaling> {
    (0..5i32, 1..30i32, 1..50i32, proptest::option::of(arb_rules()), proptest::option::of(arb_rules()), 1..600i32)
        .prop_map(|(min, span, target, up, down, idle)| {
            spec(serde_json::json!({"minReplicas": min, "maxReplicas": min + span,
                "target": {"runningPerReplica": target}, "idleWindowSeconds": idle,
                "behavior": {"scaleUp": up, "scaleDown": down}}))
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Whatever the spec, demand and history: within `[min, max]`, and zero only with
    /// `minReplicas: 0` after the idle window without requests.
    #[test]
    fn never_outside_the_range_and_zero_only_when_idle(
        s in arb_spec(),
        start in 0..40i32,
        demand in proptest::collection::vec(proptest::option::of(0.0..500.0f64), 1..60),
        step in 1_000..30_000u64,
    ) {
        let mut memory = Memory::default();
        let mut current = start;
        let mut last_use: Option<u64> = None;
        for (i, d) in demand.iter().enumerate() {
            let now = i as u64 * step;
            let signal = d.map(|r| Signal { running: r, ..Signal::default() });
            if d.is_some_and(|r| r > 0.0) || last_use.is_none() {
                last_use = Some(now);
            }
            let (out, m) = recommend(&Input { spec: &s, current, signal, busy: false, now }, &memory);
            memory = m;
            if !(current == 0 && s.min_replicas == 0) {
                prop_assert!(out.replicas >= s.min_replicas, "{out:?} below min");
            }
            prop_assert!(out.replicas <= s.max_replicas, "{out:?} above max");
            if out.replicas == 0 && current > 0 {
                prop_assert_eq!(s.min_replicas, 0);
                let idle = now - last_use.unwrap_or(0);
                prop_assert!(idle >= s.idle_window_seconds.unwrap_or(300) as u64 * 1000, "zero after {idle} ms idle: {out:?}");
            }
            current = out.replicas;
        }
    }

    /// A steady signal with noise of up to ±4.5 % never makes the count flap: once it has gone
    /// down it never goes up again, and it goes up in one run at most.
    #[test]
    fn no_flapping_under_a_steady_signal_with_noise(
        s in arb_spec(),
        start in 1..40i32,
        mean in 1.0..800.0f64,
        noise in proptest::collection::vec(-0.045..0.045f64, 20..120),
        step in 1_000..30_000u64,
    ) {
        let signals: Vec<Option<Signal>> = noise.iter().map(|n| running(mean * (1.0 + n))).collect();
        let (counts, _) = run(&s, start, &signals, step);
        let mut went_down = false;
        let mut previous = start;
        for c in &counts {
            if *c < previous {
                went_down = true;
            }
            prop_assert!(!(went_down && *c > previous), "flapped: {start} then {counts:?}");
            previous = *c;
        }
    }
}
