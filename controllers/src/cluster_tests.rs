use flotilla_apis::cluster::PoolStatus;

use super::*;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

fn ok(free: i64) -> Observed {
    Observed::Ok {
        inventory: Inventory {
            pools: vec![PoolStatus {
                name: "h100".into(),
                class: "h100".into(),
                nodes: 2,
                devices_total: 16,
                devices_allocated: 16 - free,
                devices_free: free,
                devices_managed: 0,
                node_devices: Vec::new(),
                reserved: Vec::new(),
            }],
            empty_pools: vec![],
            dra: false,
        },
        version: "v1.36.3".into(),
    }
}

const HB: Duration = Duration::from_secs(300);

#[test]
fn observed_member_is_ready_with_capacity() {
    let s = desired_status(None, Some(1), &ok(12), t(100), HB);
    assert!(s.conditions.is_true("Ready"));
    assert!(s.conditions.is_true("Reachable"));
    assert_eq!(s.devices_total, Some(16));
    assert_eq!(s.devices_free, Some(12));
    assert_eq!(s.kubernetes_version.as_deref(), Some("v1.36.3"));
    assert_eq!(s.last_heartbeat, Some(Time(t(100))));
}

#[test]
fn nothing_changed_means_identical_status_so_no_write() {
    let first = desired_status(None, Some(1), &ok(12), t(100), HB);
    let second = desired_status(Some(&first), Some(1), &ok(12), t(160), HB);
    assert_eq!(first, second, "a quiet member produces the same status, heartbeat included");
    // Twin: after the heartbeat interval the heartbeat advances (one write per interval).
    let later = desired_status(Some(&first), Some(1), &ok(12), t(100 + 300), HB);
    assert_ne!(first, later);
    // Twin: a capacity change is written at once, with a fresh heartbeat.
    let changed = desired_status(Some(&first), Some(1), &ok(8), t(130), HB);
    assert_eq!(changed.devices_free, Some(8));
    assert_eq!(changed.last_heartbeat, Some(Time(t(130))));
}

#[test]
fn without_a_heartbeat_interval_a_quiet_member_is_never_rewritten() {
    let first = desired_status(None, Some(1), &ok(12), t(100), Duration::ZERO);
    assert_eq!(first.last_heartbeat, Some(Time(t(100))), "the first answer is recorded");
    // A day later, nothing changed: the same status, so no write (the default).
    let day = desired_status(Some(&first), Some(1), &ok(12), t(100 + 86_400), Duration::ZERO);
    assert_eq!(first, day);
    // Twin: a change is still written with the time it was seen.
    let changed = desired_status(Some(&first), Some(1), &ok(8), t(100 + 86_400), Duration::ZERO);
    assert_eq!(changed.last_heartbeat, Some(Time(t(100 + 86_400))));
}

#[test]
fn failure_flips_ready_with_reason_and_keeps_heartbeat() {
    let first = desired_status(None, Some(1), &ok(12), t(100), HB);
    let down = desired_status(
        Some(&first),
        Some(1),
        &Observed::Failed(MemberError::Unreachable("timeout".into())),
        t(130),
        HB,
    );
    let ready = down.conditions.get("Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, "Unreachable");
    assert_eq!(ready.last_transition_time, Time(t(130)));
    assert_eq!(down.conditions.get("Reachable").unwrap().status, "False");
    assert_eq!(down.conditions.get("CapacityKnown").unwrap().status, "Unknown");
    assert_eq!(down.last_heartbeat, first.last_heartbeat, "no answer, no heartbeat");
    let back = desired_status(Some(&down), Some(1), &ok(12), t(160), HB);
    assert!(back.conditions.is_true("Ready"));
    assert_eq!(back.conditions.get("Ready").unwrap().last_transition_time, Time(t(160)));
}

#[test]
fn no_matching_nodes_is_not_ready() {
    let obs = Observed::Ok {
        inventory: Inventory {
            pools: vec![PoolStatus { name: "h100".into(), class: "h100".into(), ..Default::default() }],
            empty_pools: vec!["h100".into()],
            dra: false,
        },
        version: "v1.36.3".into(),
    };
    let s = desired_status(None, Some(1), &obs, t(1), HB);
    assert_eq!(s.conditions.get("Ready").unwrap().reason, "NoMatchingNodes");
    assert!(!s.conditions.is_true("Ready"));
    assert!(s.conditions.is_true("Reachable"));
}

#[test]
fn secret_and_cluster_profile_problems_have_their_reasons() {
    for (err, want) in [
        (MemberError::SecretMissing("x".into()), "SecretMissing"),
        (MemberError::Unauthorized("x".into()), "Unauthorized"),
        (MemberError::SecretInvalid("x".into()), "SecretInvalid"),
        (MemberError::ClusterProfileNotFound("x".into()), "ClusterProfileNotFound"),
        (MemberError::ClusterProfileCrdMissing("x".into()), "ClusterProfileCRDMissing"),
        (MemberError::NoMatchingAccessProvider("x".into()), "NoMatchingAccessProvider"),
        (MemberError::ClusterProfileInvalid("x".into()), "ClusterProfileInvalid"),
        (MemberError::ExecPluginFailed("x".into()), "ExecPluginFailed"),
    ] {
        let s = desired_status(None, Some(1), &Observed::Failed(err), t(1), HB);
        assert_eq!(s.conditions.get("Ready").unwrap().reason, want);
    }
}
