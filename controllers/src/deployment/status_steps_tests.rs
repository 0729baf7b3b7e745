//! One test per step of [`super::desired`] that has logic of its own; `status_tests.rs` tests
//! the steps together.

use flotilla_apis::CapacityType;
use flotilla_placement::plan::UnmetMinimum;

use super::super::decide::Refusal;
use super::*;

fn assignment(cluster: &str, pool: &str, replicas: u32, fallback_rank: u32) -> Assignment {
    Assignment {
        cluster: cluster.into(),
        pool: pool.into(),
        class: "h100".into(),
        capacity_type: CapacityType::OnDemand,
        fallback_rank,
        replicas,
        cost_micros_per_hour: 0,
    }
}

fn placement(cluster: &str, pool: &str, desired: i32, ready: i32) -> ClusterPlacement {
    ClusterPlacement {
        cluster: cluster.into(),
        pool: pool.into(),
        class: "a100".into(),
        capacity_type: CapacityType::Spot,
        fallback_rank: 2,
        desired,
        ready,
        serving: ready,
        unschedulable: 0,
    }
}

fn key(cluster: &str, pool: &str) -> Key {
    (cluster.into(), pool.into())
}

fn refusal(replicas: i32) -> Refusal {
    Refusal { replicas, message: "0/2 nodes are available".into() }
}

fn rejection(cluster: &str, reason: Reason) -> Rejection {
    Rejection { cluster: cluster.into(), reason, message: "x".into() }
}

fn plan(desired: u32, unplaced: u32, rejections: Vec<Rejection>) -> DeploymentPlan {
    DeploymentPlan {
        desired,
        assignments: vec![assignment("eu1", "h100", desired - unplaced, 1)],
        unplaced,
        rejections,
        ..Default::default()
    }
}

fn trouble(unreachable: &[&str], apply_failed: &[&str], conflicts: &[&str]) -> Trouble {
    let named = |clusters: &[&str], why: &str| clusters.iter().map(|c| (c.to_string(), why.to_string())).collect();
    Trouble::of(&Observed {
        unreachable: named(unreachable, "connection refused"),
        apply_failed: named(apply_failed, "quota exceeded"),
        name_conflicts: named(conflicts, "Service/m"),
        ..Default::default()
    })
}

#[test]
fn unschedulable_counts_refused_replicas_a_scale_down_does_not_remove() {
    // (refused, applied, wanted) → said
    for (refused, applied, wanted, said, proves) in [
        (2, 8, 8, 2, "no scale-down: every refused replica is said"),
        (2, 8, 7, 1, "a scale-down by one removes one refused pod first"),
        (2, 8, 6, 0, "a scale-down by two removes both"),
        (2, 8, 2, 0, "a scale-down larger than the refusals leaves none, never below 0"),
        (5, 3, 3, 3, "never more than the plan wants there"),
        (2, 3, 8, 2, "a scale-up removes nothing"),
        (0, 8, 8, 0, "nothing refused, nothing said"),
        (3, 0, 0, 0, "wanted nowhere: nothing said"),
    ] {
        assert_eq!(unschedulable(refused, applied, wanted), said, "{proves}");
    }
}

#[test]
fn a_planned_placement_is_ready_on_the_current_spec_and_serving_on_any() {
    let mut o = Observed::default();
    o.running.insert(key("eu1", "h100"), Running { applied: 8, ready: 6, current: 4 });
    o.refused.insert(key("eu1", "h100"), refusal(3));
    let p = planned(&assignment("eu1", "h100", 7, 2), &o);
    assert_eq!((p.desired, p.ready, p.serving, p.unschedulable, p.fallback_rank), (7, 4, 6, 2, 2));
    // Twin: a member that reported nothing there has nothing ready, serving or refused.
    let p = planned(&assignment("eu2", "h100", 7, 1), &o);
    assert_eq!((p.desired, p.ready, p.serving, p.unschedulable), (7, 0, 0, 0));
}

#[test]
fn draining_pools_are_added_with_what_the_previous_status_said_of_them() {
    let old = vec![placement("eu1", "h100", 4, 4)];
    let mut o = Observed::default();
    o.running.insert(key("eu1", "h100"), Running { applied: 4, ready: 3, current: 2 });
    o.refused.insert(key("eu1", "h100"), refusal(1));
    o.running.insert(key("eu2", "a100"), Running { applied: 2, ready: 2, current: 2 });
    o.running.insert(key("eu3", "h100"), Running { applied: 0, ready: 1, current: 1 });
    o.running.insert(key("eu4", "h100"), Running { applied: 5, ready: 5, current: 5 });
    let mut placements = vec![placement("eu4", "h100", 5, 5)];
    add_draining(&mut placements, &o, &old);
    let got: Vec<_> = placements
        .iter()
        .map(|p| {
            let r = (p.cluster.as_str(), p.class.as_str(), p.capacity_type, p.fallback_rank);
            (r, (p.desired, p.ready, p.serving, p.unschedulable))
        })
        .collect();
    assert_eq!(
        got,
        [
            // Already placed by the plan: left as it is, not added twice.
            (("eu4", "a100", CapacityType::Spot, 2), (5, 5, 5, 0)),
            // Known before: its class, capacity type and rank kept; desired 0; every refused
            // replica said (the plan wants none there, so a scale-down removes none of them).
            (("eu1", "a100", CapacityType::Spot, 2), (0, 2, 3, 1)),
            // Not in the previous status: no class, on-demand, rank 1.
            (("eu2", "", CapacityType::OnDemand, 1), (0, 2, 2, 0)),
            // eu3 asks for no replica any more: not draining, not added.
        ]
    );
}

#[test]
fn unseen_members_keep_their_previous_placements_until_their_cluster_is_gone() {
    let old = vec![
        ClusterPlacement { unschedulable: 1, ..placement("down", "h100", 3, 3) },
        placement("gone", "h100", 2, 2),
        placement("up", "h100", 2, 2),
        placement("planned", "h100", 2, 2),
    ];
    let mut o = Observed::default();
    for c in ["down", "gone", "planned"] {
        o.unreachable.insert(c.into(), "timeout".into());
    }
    o.vanished.insert("gone".into());
    let mut placements = vec![placement("planned", "h100", 5, 0)];
    add_unseen(&mut placements, &o, &old);
    assert_eq!(
        placements,
        [
            // The plan's own placement is not doubled by the previous one.
            placement("planned", "h100", 5, 0),
            // Kept where its objects may be; desired and ready 0, the rest as it was.
            ClusterPlacement { desired: 0, ready: 0, serving: 3, unschedulable: 1, ..placement("down", "h100", 0, 0) },
            // "gone" (its InferenceCluster is deleted) and "up" (observed: the plan and what it
            // runs say everything) are not kept.
        ]
    );
}

#[test]
fn placements_are_sorted_by_cluster_then_pool() {
    let plan = DeploymentPlan {
        assignments: vec![assignment("eu2", "h100", 1, 1), assignment("eu1", "h100", 1, 1)],
        ..Default::default()
    };
    let mut o = Observed::default();
    o.running.insert(key("eu1", "a100"), Running { applied: 1, ready: 1, current: 1 });
    o.unreachable.insert("eu0".into(), "timeout".into());
    let old = vec![placement("eu0", "h100", 1, 1)];
    let got: Vec<_> = placements(&plan, &o, &old).into_iter().map(|p| (p.cluster, p.pool)).collect();
    assert_eq!(got, [key("eu0", "h100"), key("eu1", "a100"), key("eu1", "h100"), key("eu2", "h100")]);
}

#[test]
fn ready_replicas_sum_the_placements_up_to_the_replicas_desired() {
    let placements = [placement("eu1", "h100", 4, 3), placement("eu2", "h100", 0, 2)];
    for (desired_total, ready, proves) in [
        (8, 5, "draining replicas ready on the current spec count"),
        (5, 5, "exactly as many as desired"),
        (4, 4, "more ready than desired (make-before-break) count as desired"),
        (0, 0, "scaled to zero: none"),
        (-1, 0, "never negative"),
    ] {
        assert_eq!(ready_replicas(&placements, desired_total), ready, "{proves}");
    }
    assert_eq!(ready_replicas(&[], 3), 0, "no placements, none ready");
}

#[test]
fn placed_says_fallback_or_why_not_and_the_claim_asking_for_the_rest() {
    let placed = placed_condition(&plan(2, 0, vec![]), None);
    assert_eq!(
        (placed.status, placed.reason, placed.message.as_str()),
        (Status::True, "Placed", "2 of 2 replicas placed")
    );
    let mut fallback = plan(2, 0, vec![]);
    fallback.assignments.push(assignment("eu2", "a100", 1, 2));
    assert_eq!(placed_condition(&fallback, None).reason, reason::FALLBACK_SELECTED);
    // A claim is named only while replicas are unplaced.
    assert_eq!(placed_condition(&plan(2, 0, vec![]), Some("ml/m")), placed);
    let short = plan(3, 1, vec![rejection("eu2", Reason::InsufficientDevices)]);
    let c = placed_condition(&short, Some("ml/m"));
    assert_eq!((c.status, c.reason), (Status::False, reason::CLAIM_PENDING));
    assert_eq!(
        c.message,
        "2 of 3 replicas placed; eu2: x; CapacityClaim ml/m asks a provider for the missing capacity (see its \
         Fulfilled condition)"
    );
    // An unmet minReplicas with every replica placed is not fully placed either.
    let mut unmet = plan(2, 0, vec![]);
    unmet.unmet_minimums = vec![UnmetMinimum { rank: 1, wanted: 3, placed: 2 }];
    let c = placed_condition(&unmet, None);
    assert_eq!((c.status, c.reason), (Status::False, reason::INSUFFICIENT_CAPACITY));
}

#[test]
fn not_placed_reason_takes_the_first_that_holds() {
    use Reason::{ClusterNotReady, CostCeilingExceeded, InsufficientDevices, JurisdictionNotAllowed};
    for (plan, claim, why, proves) in [
        (plan(3, 3, vec![rejection("a", CostCeilingExceeded)]), true, reason::CLAIM_PENDING, "a claim first"),
        (
            plan(3, 1, vec![rejection("a", InsufficientDevices), rejection("b", CostCeilingExceeded)]),
            false,
            reason::COST_CEILING_EXCEEDED,
            "the cost ceiling before capacity",
        ),
        (
            plan(3, 1, vec![rejection("a", CostCeilingExceeded), rejection("b", Reason::QuotaExceeded)]),
            false,
            reason::QUOTA_EXCEEDED,
            "the namespace's quota before the deployment's own ceiling",
        ),
        (
            plan(3, 3, vec![rejection("a", JurisdictionNotAllowed), rejection("b", InsufficientDevices)]),
            false,
            reason::INSUFFICIENT_CAPACITY,
            "one cluster short of devices is enough",
        ),
        (
            plan(3, 1, vec![rejection("a", JurisdictionNotAllowed)]),
            false,
            reason::INSUFFICIENT_CAPACITY,
            "some placed: the eligible clusters are full",
        ),
        (
            plan(3, 3, vec![rejection("a", JurisdictionNotAllowed), rejection("b", ClusterNotReady)]),
            false,
            reason::NO_ELIGIBLE_CLUSTER,
            "only rules refused and none placed",
        ),
        (plan(3, 3, vec![]), false, reason::NO_ELIGIBLE_CLUSTER, "no cluster at all"),
    ] {
        assert_eq!(not_placed_reason(&plan, claim), why, "{proves}");
    }
}

#[test]
fn capacity_says_how_many_replicas_and_which_minimums_lack_room() {
    let unmet = |rank| UnmetMinimum { rank, wanted: 4, placed: 1 };
    for (unplaced, minimums, status, message) in [
        (0, vec![], Status::True, "the fleet has room for every replica"),
        (2, vec![], Status::False, "2 replica(s) need capacity the fleet does not have"),
        (
            0,
            vec![unmet(2)],
            Status::False,
            "alternative 2 wants at least 4 replica(s) and only 1 could be placed on it",
        ),
        (
            1,
            vec![unmet(1), unmet(2)],
            Status::False,
            "1 replica(s) need capacity the fleet does not have; alternative 1 wants at least 4 replica(s) and only 1 \
             could be placed on it; alternative 2 wants at least 4 replica(s) and only 1 could be placed on it",
        ),
    ] {
        let p = DeploymentPlan { desired: 4, unplaced, unmet_minimums: minimums, ..Default::default() };
        let c = capacity_condition(&p);
        let want = if status == Status::True { reason::AS_EXPECTED } else { reason::INSUFFICIENT_CAPACITY };
        assert_eq!(
            (c.type_, c.status, c.reason, c.message.as_str()),
            (condition::CAPACITY_AVAILABLE, status, want, message)
        );
    }
}

#[test]
fn trouble_lists_unreachable_members_then_refused_applies() {
    let t = trouble(&["eu2", "eu1"], &["eu0"], &[]);
    assert_eq!(t.problems, ["eu1: connection refused", "eu2: connection refused", "eu0: apply failed: quota exceeded"]);
    assert!(t.apply_failed);
    assert_eq!(t.tail(), "; eu1: connection refused; eu2: connection refused; eu0: apply failed: quota exceeded");
    // Twin: nothing wrong, nothing appended.
    let t = trouble(&[], &[], &[]);
    assert!(!t.apply_failed);
    assert_eq!(t.tail(), "");
    let t = trouble(&["eu2"], &[], &["eu1"]);
    assert_eq!(
        t.conflict_message(1, 2),
        "1/2 replicas ready; names taken by objects that are not this deployment's: eu1: Service/m; rename the \
         ModelDeployment or the other object; eu2: connection refused"
    );
}

#[test]
fn ready_is_true_only_with_every_replica_ready_or_none_wanted() {
    let (quiet, down, conflict) = (trouble(&[], &[], &[]), trouble(&["eu2"], &[], &[]), trouble(&[], &[], &["eu1"]));
    for (ready, desired, t, status, why, message) in [
        (8, 8, &quiet, Status::True, reason::ALL_REPLICAS_READY, "8/8 replicas ready"),
        (8, 8, &down, Status::True, reason::ALL_REPLICAS_READY, "8/8 replicas ready"),
        (0, 0, &down, Status::True, reason::AS_EXPECTED, "scaled to zero"),
        (0, 8, &down, Status::False, reason::NO_REPLICAS_READY, "0/8 replicas ready; eu2: connection refused"),
        (1, 8, &quiet, Status::False, reason::REPLICAS_NOT_READY, "1/8 replicas ready"),
        (1, 8, &down, Status::False, reason::REPLICAS_NOT_READY, "1/8 replicas ready; eu2: connection refused"),
        (
            8,
            8,
            &conflict,
            Status::False,
            reason::NAME_CONFLICT,
            "8/8 replicas ready; names taken by objects that are not this deployment's: eu1: Service/m; rename the \
             ModelDeployment or the other object",
        ),
    ] {
        let c = ready_condition(ready, desired, t);
        assert_eq!((c.type_, c.status, c.reason, c.message.as_str()), (condition::READY, status, why, message));
    }
}

#[test]
fn degraded_is_some_but_not_all_ready_a_refused_apply_or_a_name_conflict() {
    let quiet = trouble(&[], &[], &[]);
    let (down, refused) = (trouble(&["eu2"], &[], &[]), trouble(&["eu2"], &["eu1"], &[]));
    let conflict = trouble(&[], &[], &["eu1"]);
    let both = "eu2: connection refused; eu1: apply failed: quota exceeded";
    let partly = format!("1/8 replicas ready; {both}");
    for (ready, desired, t, status, why, message) in [
        (8, 8, &quiet, Status::False, reason::AS_EXPECTED, "8/8 replicas ready"),
        (0, 8, &down, Status::False, reason::AS_EXPECTED, "0/8 replicas ready"),
        (1, 8, &down, Status::True, reason::REPLICAS_NOT_READY, "1/8 replicas ready; eu2: connection refused"),
        (1, 8, &refused, Status::True, reason::REPLICAS_NOT_READY, partly.as_str()),
        (8, 8, &refused, Status::True, reason::APPLY_FAILED, both),
        (0, 8, &refused, Status::True, reason::APPLY_FAILED, both),
        (
            0,
            8,
            &conflict,
            Status::True,
            reason::NAME_CONFLICT,
            "0/8 replicas ready; names taken by objects that are not this deployment's: eu1: Service/m; rename the \
             ModelDeployment or the other object",
        ),
    ] {
        let c = degraded_condition(ready, desired, t);
        assert_eq!((c.type_, c.status, c.reason, c.message.as_str()), (condition::DEGRADED, status, why, message));
    }
}

#[test]
fn reasons_are_bounded_with_one_entry_counting_the_rest() {
    let rejections: Vec<Rejection> =
        (0..MAX_REASONS + 3).map(|i| rejection(&format!("c{i}"), Reason::InsufficientDevices)).collect();
    for (n, len, last) in [
        (0, 0, None),
        (1, 1, Some("c0")),
        (MAX_REASONS, MAX_REASONS, Some("c15")),
        (MAX_REASONS + 3, MAX_REASONS + 1, Some("*")),
    ] {
        let r = reasons(&rejections[..n]);
        assert_eq!((r.len(), r.last().map(|r| r.cluster.as_str())), (len, last), "{n} rejections");
    }
    let r = reasons(&rejections);
    assert_eq!(
        r[MAX_REASONS],
        ClusterRejection {
            cluster: "*".into(),
            reason: "Truncated".into(),
            message: "3 more clusters refused; `fleetctl explain` lists them all".into()
        }
    );
    assert_eq!((r[0].reason.as_str(), r[0].message.as_str()), ("InsufficientDevices", "x"));
}

#[test]
fn unplaced_is_written_only_while_replicas_are() {
    let u = unplaced(&plan(3, 2, vec![rejection("eu2", Reason::InsufficientDevices)])).expect("unplaced");
    assert_eq!((u.replicas, u.reasons.len()), (2, 1));
    // Twin: every replica placed, even with rejections left in the plan.
    assert_eq!(unplaced(&plan(3, 0, vec![rejection("eu2", Reason::InsufficientDevices)])), None);
}

#[test]
fn the_clusters_column_is_ready_over_desired_per_placement_and_absent_without_any() {
    assert_eq!(clusters_column(&[]), None);
    let placements = [placement("eu1", "h100", 4, 3), placement("eu2", "a100", 0, 2)];
    assert_eq!(clusters_column(&placements).as_deref(), Some("eu1:3/4,eu2:2/0"));
}
