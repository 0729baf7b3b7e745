//! Giving surplus back under `spec.disruption`, on the simulated provider: a shrunk claim keeps
//! busy nodes until the application drained them (`DrainRequired`), `consolidation: Disabled`
//! and `minLifetime` keep surplus without a single provider call, pods that cannot be seen keep
//! `WhenEmpty` nodes, the newest allocation goes first, and a deleted claim waits for drain.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use flotilla_apis::claim::{Consolidation, DisruptionPolicy, ScaleDown};
use flotilla_apis::common::CapacityType::OnDemand;
use flotilla_apis::constants::{condition, labels, reason};
use flotilla_providers::{ClaimInput, ClaimUsage, NodeUse};
use support::*;

fn one_region(nodes: u32) -> flotilla_providers::SimCloud {
    let mut c = cloud(vec![region("eu-central-1", "EU", vec![offering("h100", OnDemand, 98, nodes)])]);
    c.provisioning_delay = Duration::ZERO;
    c
}

fn policy(min_lifetime: Option<&str>, consolidation: Consolidation, scale_down: ScaleDown) -> DisruptionPolicy {
    DisruptionPolicy { min_lifetime: min_lifetime.map(str::to_string), consolidation, scale_down }
}

/// A fulfilled two-pod claim (two nodes of one acquisition in one zone) with `p`.
async fn fulfilled(p: DisruptionPolicy) -> Harness {
    let mut spec = claim(2, &[OnDemand], &["h100"], &["EU"]);
    spec.disruption = Some(p);
    let mut h = Harness::new(one_region(4), spec);
    h.step().await;
    assert_eq!(h.condition(condition::FULFILLED).0, "True");
    assert_eq!(h.status.allocations.len(), 1);
    assert_eq!(h.status.allocations[0].nodes, 2);
    h
}

/// The acquisition and node names the claim holds.
fn held(h: &Harness) -> (String, Vec<String>) {
    let acqs = h.sim.acquisitions();
    let live: Vec<_> = acqs.iter().filter(|a| a.nodes_granted > 0).collect();
    assert_eq!(live.len(), 1, "one live acquisition: {acqs:?}");
    (live[0].id.clone(), live[0].nodes.iter().map(|n| n.name.clone()).collect())
}

fn usage(cluster: &str, acquisition: &str, nodes: &[(&str, u32)]) -> ClaimUsage {
    ClaimUsage {
        clusters: BTreeSet::from([cluster.to_string()]),
        nodes: nodes
            .iter()
            .map(|(n, pods)| NodeUse {
                name: (*n).to_string(),
                acquisition: acquisition.to_string(),
                pods: *pods,
                provider_id: None,
            })
            .collect(),
    }
}

fn shrink_calls(h: &Harness) -> usize {
    let calls = h.sim.calls();
    calls.resize.len() + calls.release.len()
}

#[tokio::test]
async fn a_shrunk_claim_keeps_busy_nodes_until_the_application_drained_them() {
    let mut h = fulfilled(policy(None, Consolidation::WhenEmpty, ScaleDown::ApplicationDrainOnly)).await;
    let (acq, nodes) = held(&h);
    let request = &h.sim.calls().acquire[0];
    assert_eq!(request.labels.get(labels::ACQUISITION), Some(&acq));
    assert_eq!(request.labels.get(labels::CONSOLIDATION).map(String::as_str), Some("WhenEmpty"));
    assert_eq!(request.labels.get(labels::SCALE_DOWN).map(String::as_str), Some("ApplicationDrainOnly"));
    assert_eq!(h.condition(condition::SURPLUS).1, reason::AS_EXPECTED);

    // The deployment scaled in: one pod is enough now, but both nodes still run a replica.
    h.spec.pod_sets[0].count = 1;
    h.usage = usage("cl-eu-central-1", &acq, &[(&nodes[0], 1), (&nodes[1], 1)]);
    let out = h.step().await;
    assert!(out.changed);
    assert_eq!(shrink_calls(&h), 0, "nothing is given back while the application runs there");
    let (status, why, message) = h.condition(condition::SURPLUS);
    assert_eq!((status.as_str(), why.as_str()), ("True", reason::DRAIN_REQUIRED));
    assert!(message.contains(&nodes[0]) && message.contains(&nodes[1]), "names the nodes to drain: {message}");
    assert_eq!(h.condition(condition::FULFILLED).0, "True", "still holds what it needs");
    assert!(out.requeue_after <= Duration::from_secs(10), "looks again soon: {:?}", out.requeue_after);
    // Looking again with nothing changed writes nothing and asks nothing.
    assert!(!h.step().await.changed);
    assert_eq!(shrink_calls(&h), 0);

    // The replica left the second node: exactly that node goes.
    h.usage = usage("cl-eu-central-1", &acq, &[(&nodes[0], 1), (&nodes[1], 0)]);
    h.step().await;
    assert_eq!(h.sim.calls().resize, [("eu-central-1".to_string(), acq.clone(), 1)]);
    let (_, left) = held(&h);
    assert_eq!(left, [nodes[0].clone()], "the drained node was removed, the busy one kept");
    assert_eq!(h.condition(condition::SURPLUS).1, reason::SCALING_DOWN);
    assert_eq!((h.status.allocations[0].nodes, h.status.allocations[0].pods), (1, 1));
    assert_eq!(h.status.devices_obtained, 8);

    h.usage = usage("cl-eu-central-1", &acq, &[(&nodes[0], 1)]);
    h.step().await;
    assert_eq!(h.condition(condition::SURPLUS).1, reason::AS_EXPECTED);
    assert!(!h.step().await.changed, "settled");
    assert_eq!(h.sim.calls().resize.len(), 1);
}

#[tokio::test]
async fn consolidation_disabled_keeps_surplus_without_asking_the_provider() {
    let mut h = fulfilled(policy(None, Consolidation::Disabled, ScaleDown::Any)).await;
    let (acq, nodes) = held(&h);
    h.spec.pod_sets[0].count = 1;
    h.usage = usage("cl-eu-central-1", &acq, &[(&nodes[0], 0), (&nodes[1], 0)]);
    h.run_for(Duration::from_secs(6 * 3600)).await;
    assert_eq!(shrink_calls(&h), 0, "six hours, empty nodes, nothing given back");
    let (status, why, message) = h.condition(condition::SURPLUS);
    assert_eq!((status.as_str(), why.as_str()), ("True", reason::CONSOLIDATION_BLOCKED));
    assert!(message.contains("consolidation is Disabled"), "{message}");
    assert_eq!(held(&h).1.len(), 2);
}

#[tokio::test]
async fn min_lifetime_holds_surplus_until_it_passes_then_lets_it_go() {
    let mut h = fulfilled(policy(Some("1h"), Consolidation::WhenUnderutilized, ScaleDown::Any)).await;
    let (acq, nodes) = held(&h);
    h.spec.pod_sets[0].count = 1;
    h.usage = usage("cl-eu-central-1", &acq, &[(&nodes[0], 1), (&nodes[1], 1)]);
    h.clock.advance(Duration::from_secs(600));
    let out = h.step().await;
    assert_eq!(shrink_calls(&h), 0);
    let (_, why, message) = h.condition(condition::SURPLUS);
    assert_eq!(why, reason::CONSOLIDATION_BLOCKED);
    assert!(message.contains("minLifetime 1h"), "{message}");
    assert_eq!(out.requeue_after, Duration::from_secs(300), "resync first; the hold lifts in 50 minutes");
    h.clock.advance(Duration::from_secs(50 * 60));
    h.step().await;
    // WhenUnderutilized with scaleDown Any: the surplus goes even though it runs a pod.
    assert_eq!(h.sim.calls().resize, [("eu-central-1".to_string(), acq, 1)]);
    assert_eq!(h.condition(condition::SURPLUS).1, reason::SCALING_DOWN);
}

#[tokio::test]
async fn pods_that_cannot_be_seen_keep_when_empty_nodes() {
    let mut h = fulfilled(policy(None, Consolidation::WhenEmpty, ScaleDown::Any)).await;
    h.spec.pod_sets[0].count = 1;
    h.usage = ClaimUsage::default();
    h.step().await;
    assert_eq!(shrink_calls(&h), 0);
    let (_, why, message) = h.condition(condition::SURPLUS);
    assert_eq!(why, reason::CONSOLIDATION_BLOCKED);
    assert!(message.contains("cannot be seen"), "{message}");

    // WhenEmpty with the nodes visible and one empty: that one goes.
    let (acq, nodes) = held(&h);
    h.usage = usage("cl-eu-central-1", &acq, &[(&nodes[0], 0), (&nodes[1], 3)]);
    h.step().await;
    let (_, left) = held(&h);
    assert_eq!(left, [nodes[1].clone()]);
}

#[tokio::test]
async fn the_newest_allocation_is_given_back_first_and_whole() {
    // One node free in each region: the two-pod claim holds one node in each.
    let mut c = cloud(vec![
        region("eu-central-1", "EU", vec![offering("h100", OnDemand, 98, 1)]),
        region("eu-west-1", "EU", vec![offering("h100", OnDemand, 99, 1)]),
    ]);
    c.provisioning_delay = Duration::ZERO;
    c.regions.iter_mut().for_each(|r| r.zones.truncate(1));
    let mut spec = claim(2, &[OnDemand], &["h100"], &["EU"]);
    spec.disruption = Some(policy(None, Consolidation::WhenEmpty, ScaleDown::Any));
    let mut h = Harness::new(c, spec);
    h.step().await;
    let clusters: Vec<_> = h.status.allocations.iter().map(|a| a.cluster.clone()).collect();
    assert_eq!(clusters, ["cl-eu-central-1", "cl-eu-west-1"]);
    let newest = h.status.allocations[1].pool.clone();
    h.spec.pod_sets[0].count = 1;
    h.usage = ClaimUsage {
        clusters: BTreeSet::from(["cl-eu-central-1".to_string(), "cl-eu-west-1".to_string()]),
        nodes: Vec::new(),
    };
    h.step().await;
    assert_eq!(h.sim.calls().release, [("eu-west-1".to_string(), newest)]);
    assert!(h.sim.calls().resize.is_empty());
    let clusters: Vec<_> = h.status.allocations.iter().map(|a| a.cluster.clone()).collect();
    assert_eq!(clusters, ["cl-eu-central-1"], "the older allocation is kept");
    assert_eq!(h.condition(condition::FULFILLED).0, "True");
}

#[tokio::test]
async fn a_deleted_claim_waits_for_the_application_to_drain() {
    let h = fulfilled(policy(None, Consolidation::WhenEmpty, ScaleDown::ApplicationDrainOnly)).await;
    let (acq, nodes) = held(&h);
    let input = |usage| ClaimInput { usage, ..h.input() };
    let busy = usage("cl-eu-central-1", &acq, &[(&nodes[0], 0), (&nodes[1], 2)]);
    let step = h.engine.hold_for_drain(input(&busy)).expect("busy node holds the release");
    let c = step.status.conditions.get(condition::SURPLUS).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", reason::DRAIN_REQUIRED));
    assert!(c.message.contains(&format!("{} (2 pod(s))", nodes[1])), "{}", c.message);
    assert!(!c.message.contains(&nodes[0]), "the empty node is not named: {}", c.message);
    let unseen = ClaimUsage::default();
    assert!(h.engine.hold_for_drain(input(&unseen)).is_some(), "unseen pods hold it too");
    let empty = usage("cl-eu-central-1", &acq, &[(&nodes[0], 0), (&nodes[1], 0)]);
    assert!(h.engine.hold_for_drain(input(&empty)).is_none());

    let mut any = h.spec.clone();
    any.disruption = Some(policy(None, Consolidation::WhenEmpty, ScaleDown::Any));
    let input = ClaimInput { spec: &any, ..input(&busy) };
    assert!(h.engine.hold_for_drain(input).is_none(), "scaleDown Any does not wait");
}

#[test]
fn autoscalers_may_remove_only_what_the_claim_lets_go() {
    use flotilla_providers::claim::autoscaler_may_remove;
    let mut spec = claim(1, &[OnDemand], &["h100"], &["EU"]);
    let since = Some(t0());
    let later = flotilla_providers::clock::add(t0(), Duration::from_secs(7200));
    spec.disruption = Some(policy(None, Consolidation::WhenUnderutilized, ScaleDown::Any));
    assert!(autoscaler_may_remove(&spec, since, t0()));
    spec.disruption = Some(policy(Some("1h"), Consolidation::WhenUnderutilized, ScaleDown::Any));
    assert!(!autoscaler_may_remove(&spec, since, t0()), "too young");
    assert!(autoscaler_may_remove(&spec, since, later));
    spec.latency.as_mut().unwrap().warm = true;
    assert!(!autoscaler_may_remove(&spec, since, later), "warm capacity is not idle capacity");
    spec.latency.as_mut().unwrap().warm = false;
    for (c, s) in [
        (Consolidation::WhenEmpty, ScaleDown::Any),
        (Consolidation::Disabled, ScaleDown::Any),
        (Consolidation::WhenUnderutilized, ScaleDown::ApplicationDrainOnly),
    ] {
        spec.disruption = Some(policy(None, c, s));
        assert!(!autoscaler_may_remove(&spec, since, later), "{c:?} {s:?}");
    }
    spec.disruption = None;
    assert!(!autoscaler_may_remove(&spec, since, later), "the default (WhenEmpty) is ours to act on");
}
