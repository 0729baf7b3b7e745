use flotilla_placement::plan::{Assignment, Rejection};
use k8s_openapi::jiff::Timestamp;

use super::*;

fn plan(desired: u32, placed: u32) -> DeploymentPlan {
    DeploymentPlan {
        namespace: "ml".into(),
        name: "m".into(),
        model: "m".into(),
        desired,
        assignments: vec![Assignment {
            cluster: "eu1".into(),
            pool: "h100".into(),
            class: "h100".into(),
            capacity_type: flotilla_apis::CapacityType::OnDemand,
            fallback_rank: 1,
            replicas: placed,
            cost_micros_per_hour: 0,
        }],
        unplaced: desired - placed,
        rejections: (0..40)
            .map(|i| Rejection {
                cluster: format!("c{i}"),
                reason: Reason::JurisdictionNotAllowed,
                message: "x".into(),
            })
            .take(if placed < desired { 40 } else { 0 })
            .collect(),
        ..Default::default()
    }
}

fn observed(ready: i32) -> Observed {
    let mut o = Observed::default();
    o.running.insert(("eu1".into(), "h100".into()), Running { applied: 8, ready, current: ready });
    o
}

fn now() -> Time {
    Time(Timestamp::from_second(1_000).unwrap())
}

const BACKOFF: std::time::Duration = std::time::Duration::from_secs(600);

#[test]
fn a_refused_pool_stays_backed_off_after_its_pods_are_gone_then_is_dropped() {
    let at = |s: i64| Time(Timestamp::from_second(s).unwrap());
    let refused = |message: &str| super::super::decide::Refusal { replicas: 1, message: message.into() };
    let mut o = observed(7);
    o.refused.insert(("eu1".into(), "h100".into()), refused("0/2 nodes are available: 2 Insufficient nvidia.com/gpu."));
    let s = desired(None, Some(1), &plan(8, 7), &o, &at(1_000), BACKOFF);
    assert_eq!(s.refused_pools.len(), 1);
    let r = &s.refused_pools[0];
    assert_eq!(
        (r.cluster.as_str(), r.pool.as_str(), r.retry_after.0.as_second(), r.devices_short),
        ("eu1", "h100", 1_600, true)
    );
    // The refused pod is gone (the replica moved): the pool stays backed off until 1,600...
    let later = desired(Some(&s), Some(1), &plan(8, 7), &observed(7), &at(1_300), BACKOFF);
    assert_eq!(later.refused_pools, s.refused_pools, "not renewed, not dropped");
    // ... and is dropped when that time comes (the solver may try the pool again).
    let ended = desired(Some(&later), Some(1), &plan(8, 7), &observed(7), &at(1_600), BACKOFF);
    assert!(ended.refused_pools.is_empty());
    // Still refused when it ends: backed off again from then.
    let again = desired(Some(&later), Some(1), &plan(8, 7), &o, &at(1_600), BACKOFF);
    assert_eq!(again.refused_pools[0].retry_after.0.as_second(), 2_200);
    // A taint is this deployment's business only: not `devicesShort`.
    let mut t = observed(7);
    t.refused.insert(
        ("eu1".into(), "h100".into()),
        refused("0/2 nodes are available: 2 node(s) had untolerated taint {x: y}."),
    );
    assert!(!desired(None, Some(1), &plan(8, 7), &t, &at(1_000), BACKOFF).refused_pools[0].devices_short);
    // CPU or memory a pod asks for concerns that deployment only, even next to a device
    // shortage on other nodes (which does close the pool to pods as large).
    for (message, short) in [
        ("0/2 nodes are available: 2 Insufficient cpu.", false),
        ("0/2 nodes are available: 1 Insufficient memory, 1 Insufficient hugepages-2Mi.", false),
        ("0/3 nodes are available: 1 Insufficient cpu, 2 Insufficient nvidia.com/gpu.", true),
        ("0/2 nodes are available: 2 cannot allocate all claims.", true),
    ] {
        let mut c = observed(7);
        c.refused.insert(("eu1".into(), "h100".into()), refused(message));
        assert_eq!(
            desired(None, Some(1), &plan(8, 7), &c, &at(1_000), BACKOFF).refused_pools[0].devices_short,
            short,
            "{message}"
        );
    }
    // No back-off configured: nothing kept.
    assert!(desired(None, Some(1), &plan(8, 7), &o, &at(1_000), std::time::Duration::ZERO).refused_pools.is_empty());
    // Bounded: at most MAX_REFUSED_POOLS entries, those that end last.
    let mut many = observed(7);
    for i in 0..MAX_REFUSED_POOLS + 5 {
        many.refused.insert((format!("c{i:03}"), "h100".into()), refused("x"));
    }
    let old = ModelDeploymentStatus {
        refused_pools: vec![RefusedPool {
            cluster: "old".into(),
            pool: "p".into(),
            retry_after: at(1_100),
            devices_short: false,
            message: String::new(),
        }],
        ..Default::default()
    };
    let s = desired(Some(&old), Some(1), &plan(8, 7), &many, &at(1_000), BACKOFF);
    assert_eq!(s.refused_pools.len(), MAX_REFUSED_POOLS);
    assert!(!s.refused_pools.iter().any(|r| r.cluster == "old"), "the one ending first is left out");
}

#[test]
fn refused_replicas_are_counted_once_and_not_those_a_scale_down_removes() {
    let refused = |replicas| super::super::decide::Refusal { replicas, message: "0/2 nodes".into() };
    // 8 asked for and wanted, 2 refused: the placement says 2.
    let mut o = observed(6);
    o.refused.insert(("eu1".into(), "h100".into()), refused(2));
    let s = desired(None, Some(1), &plan(8, 8), &o, &now(), BACKOFF);
    assert_eq!(s.placements[0].unschedulable, 2);
    // The plan now wants 7 there (one moved away): the scale-down 8 → 7 removes one of the
    // refused pods first, so one is left to say.
    let s = desired(None, Some(1), &plan(8, 7), &o, &now(), BACKOFF);
    assert_eq!(s.placements[0].unschedulable, 1);
    // Wants 6: both go with the scale-down, none is said (the running 6 stay where they are).
    let s = desired(None, Some(1), &plan(8, 6), &o, &now(), BACKOFF);
    assert_eq!(s.placements[0].unschedulable, 0);
    // Twin: nothing refused, nothing said (and left out of the serialised status).
    let s = desired(None, Some(1), &plan(8, 8), &observed(6), &now(), BACKOFF);
    assert_eq!(s.placements[0].unschedulable, 0);
    assert!(serde_json::to_value(&s.placements[0]).unwrap().get("unschedulable").is_none());
}

#[test]
fn one_of_eight_is_degraded_never_ready() {
    let s = desired(None, Some(1), &plan(8, 8), &observed(1), &now(), BACKOFF);
    assert_eq!(s.ready_replicas, 1);
    assert_eq!(s.conditions.get("Ready").unwrap().status, "False");
    assert_eq!(s.conditions.get("Degraded").unwrap().status, "True");
    // Twin: all eight ready.
    let s = desired(None, Some(1), &plan(8, 8), &observed(8), &now(), BACKOFF);
    assert!(s.conditions.is_true("Ready"));
    assert_eq!(s.conditions.get("Degraded").unwrap().status, "False");
}

#[test]
fn nothing_observed_is_not_ready() {
    let s = desired(None, Some(1), &plan(2, 2), &Observed::default(), &now(), BACKOFF);
    assert_eq!(s.conditions.get("Ready").unwrap().reason, "NoReplicasReady");
}

#[test]
fn unplaced_is_reported_with_bounded_reasons() {
    let s = desired(None, Some(1), &plan(6, 4), &observed(4), &now(), BACKOFF);
    let placed = s.conditions.get("Placed").unwrap();
    assert_eq!(placed.status, "False");
    assert!(placed.message.starts_with("4 of 6 replicas placed"), "{}", placed.message);
    let u = s.unplaced.unwrap();
    assert_eq!(u.replicas, 2);
    assert_eq!(u.reasons.len(), MAX_REASONS + 1);
    assert_eq!(u.reasons.last().unwrap().reason, "Truncated");
}

#[test]
fn waiting_for_cache_names_clusters_and_phases() {
    let mut o = observed(0);
    o.cache = Some(CacheWait {
        cache: "ml/llama".into(),
        waiting: BTreeMap::from([
            ("eu1".into(), "Downloading".into()),
            ("eu2".into(), "Failed (DigestMismatch)".into()),
        ]),
    });
    let s = desired(None, Some(1), &plan(2, 2), &o, &now(), BACKOFF);
    let c = s.conditions.get("WaitingForCache").unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "CacheNotReady"));
    assert!(c.message.contains("eu1 (Downloading), eu2 (Failed (DigestMismatch))"), "{}", c.message);
    // Twins: Ready everywhere is False; no cacheRef writes no such condition at all.
    o.cache = Some(CacheWait { cache: "ml/llama".into(), waiting: BTreeMap::new() });
    let s = desired(Some(&s), Some(1), &plan(2, 2), &o, &now(), BACKOFF);
    assert_eq!(s.conditions.get("WaitingForCache").unwrap().status, "False");
    let s = desired(None, Some(1), &plan(2, 2), &observed(0), &now(), BACKOFF);
    assert!(s.conditions.get("WaitingForCache").is_none());
}

#[test]
fn an_unobserved_member_keeps_its_placement_until_its_cluster_is_gone() {
    let running = desired(None, Some(1), &plan(2, 2), &observed(2), &now(), BACKOFF);
    assert_eq!(running.placements.len(), 1);
    let cluster = running.placements[0].cluster.clone();
    // The plan no longer wants it (the member is down) and it cannot be observed.
    let mut down = Observed::default();
    down.unreachable.insert(cluster.clone(), "connection failed".into());
    let nowhere = DeploymentPlan { assignments: vec![], ..plan(2, 0) };
    let kept = desired(Some(&running), Some(1), &nowhere, &down, &now(), BACKOFF);
    assert_eq!(kept.placements.len(), 1, "still where the objects may be");
    assert_eq!((kept.placements[0].desired, kept.placements[0].ready), (0, 0), "no stale evidence");
    down.vanished.insert(cluster);
    assert!(desired(Some(&kept), Some(1), &nowhere, &down, &now(), BACKOFF).placements.is_empty());
}

#[test]
fn a_rollout_in_progress_is_not_ready_on_the_old_spec_but_still_serving() {
    // 8 replicas ready on the previous spec, none on the current one yet.
    let mut o = Observed::default();
    o.running.insert(("eu1".into(), "h100".into()), Running { applied: 8, ready: 8, current: 0 });
    let s = desired(None, Some(2), &plan(8, 8), &o, &now(), BACKOFF);
    assert_eq!(s.ready_replicas, 0);
    assert_eq!(s.conditions.get("Ready").unwrap().reason, "NoReplicasReady");
    assert_eq!((s.placements[0].ready, s.placements[0].serving), (0, 8), "they serve: the gateway routes");
    // Half way: 4 on the current spec.
    o.running.insert(("eu1".into(), "h100".into()), Running { applied: 8, ready: 8, current: 4 });
    let s = desired(Some(&s), Some(2), &plan(8, 8), &o, &now(), BACKOFF);
    assert_eq!(s.ready_replicas, 4);
    assert!(s.conditions.is_true("Degraded"));
}

#[test]
fn the_autoscalers_status_is_kept_by_the_controllers_write() {
    use flotilla_apis::autoscaling::{AutoscalingReason, AutoscalingStatus};
    let mut before = desired(None, Some(1), &plan(2, 2), &observed(2), &now(), BACKOFF);
    before.autoscaling =
        Some(AutoscalingStatus { recommendation: 2, reason: Some(AutoscalingReason::Steady), ..Default::default() });
    let next = desired(Some(&before), Some(1), &plan(2, 2), &observed(2), &now(), BACKOFF);
    assert_eq!(next.autoscaling, before.autoscaling);
    // And so the status patch neither nulls nor rewrites it.
    let patch = crate::status_patch::status_patch(Some(&before), &next).unwrap();
    assert_eq!(patch["status"]["autoscaling"]["reason"], "Steady");
    assert_eq!(next, before, "nothing else changed: no write at all");
}

#[test]
fn capacity_says_which_minimum_is_unmet_when_every_replica_is_placed() {
    let mut p = plan(4, 4);
    p.unmet_minimums = vec![flotilla_placement::plan::UnmetMinimum { rank: 2, wanted: 4, placed: 2 }];
    let s = desired(None, Some(1), &p, &observed(4), &now(), BACKOFF);
    let c = s.conditions.get(condition::CAPACITY_AVAILABLE).unwrap();
    assert_eq!(c.status, "False");
    assert_eq!(c.message, "alternative 2 wants at least 4 replica(s) and only 2 could be placed on it");
    assert!(!c.message.contains("0 replica"), "{}", c.message);
    let s = desired(None, Some(1), &plan(4, 3), &observed(3), &now(), BACKOFF);
    let c = s.conditions.get(condition::CAPACITY_AVAILABLE).unwrap();
    assert_eq!(c.message, "1 replica(s) need capacity the fleet does not have");
}

#[test]
fn same_inputs_same_status_so_no_write() {
    let a = desired(None, Some(1), &plan(2, 2), &observed(2), &now(), BACKOFF);
    let later = Time(Timestamp::from_second(2_000).unwrap());
    let b = desired(Some(&a), Some(1), &plan(2, 2), &observed(2), &later, BACKOFF);
    assert_eq!(a, b);
}

#[test]
fn invalid_spec_says_so_naming_the_field_and_keeps_the_rest() {
    let before = desired(None, Some(1), &plan(4, 4), &observed(4), &now(), BACKOFF);
    let bad = InvalidSpec { field: "spec.devices.alternatives[0].selectors[0]".into(), message: "too deep".into() };
    let after = invalid(Some(&before), Some(2), &bad, &now());
    let placed = after.conditions.0.iter().find(|c| c.type_ == condition::PLACED).expect("Placed");
    assert_eq!((placed.status.as_str(), placed.reason.as_str()), ("False", reason::INVALID_SPEC));
    assert!(placed.message.starts_with("spec.devices.alternatives[0].selectors[0]: too deep"), "{}", placed.message);
    // Nothing else changes: placements, ready counts and the other conditions stay.
    assert_eq!((after.placements.clone(), after.ready_replicas), (before.placements.clone(), before.ready_replicas));
    let others = |s: &ModelDeploymentStatus| -> Vec<_> {
        s.conditions
            .0
            .iter()
            .filter(|c| c.type_ != condition::PLACED)
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect()
    };
    assert_eq!(others(&after), others(&before));
    assert_eq!(invalid(Some(&after), Some(2), &bad, &now()), after, "the same invalid spec writes nothing new");
}
