//! Claim topology on the simulated provider (`sameZone` keeps every pod set in one zone, a
//! required placement group asks all-or-nothing), selector-only device alternatives, and the
//! `static` provider: offerings from declared pools, nothing beyond them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_apis::claim::{ClaimDeviceClass, ClaimTopology, PlacementGroupMode, PodSet};
use flotilla_apis::cluster::{ClusterProvider, InferenceClusterSpec, NodePool, StaticCluster};
use flotilla_apis::common::CapacityType::{OnDemand, Reserved};
use flotilla_apis::common::JurisdictionCode;
use flotilla_apis::constants::{condition, reason};
use flotilla_apis::deployment::CelExpression;
use flotilla_providers::{AcquireRequest, CapacityProvider, ErrorKind, ProviderSet, StaticProvider};
use support::*;

fn split_zones_cloud() -> flotilla_providers::SimCloud {
    // Zone a is cheaper but has one node; zone b has three.
    let mut a = offering("h100", OnDemand, 90, 1);
    a.zones = vec!["eu-central-1a".into()];
    let mut b = offering("h100", OnDemand, 98, 3);
    b.zones = vec!["eu-central-1b".into()];
    let mut c = cloud(vec![region("eu-central-1", "EU", vec![a, b])]);
    c.provisioning_delay = Duration::ZERO;
    c
}

fn two_pod_sets(same_zone: bool) -> flotilla_apis::claim::CapacityClaimSpec {
    let mut spec = claim(1, &[OnDemand], &["h100"], &["EU"]);
    spec.pod_sets.push(PodSet { name: "prefill".into(), count: 1, devices_per_pod: 8 });
    spec.topology = Some(ClaimTopology { same_zone, placement_group: PlacementGroupMode::None });
    spec
}

fn zones_asked(h: &Harness) -> Vec<String> {
    h.sim.calls().acquire.iter().flat_map(|r| r.zones.clone()).collect()
}

#[tokio::test]
async fn without_same_zone_pod_sets_spread_over_zones() {
    let mut h = Harness::new(split_zones_cloud(), two_pod_sets(false));
    h.step().await;
    assert_eq!(zones_asked(&h), ["eu-central-1a", "eu-central-1b"], "zone a is full after the first pod set");
    assert_eq!(h.condition(condition::FULFILLED).0, "True");
}

#[tokio::test]
async fn same_zone_never_asks_for_another_zone() {
    let mut h = Harness::new(split_zones_cloud(), two_pod_sets(true));
    h.step().await;
    assert_eq!(zones_asked(&h), ["eu-central-1a"], "pinned to the first pod set's zone");
    let (status, why, message) = h.condition(condition::FULFILLED);
    assert_eq!((status.as_str(), why.as_str()), ("False", reason::PARTIALLY_FULFILLED));
    assert!(message.contains("sameZone"), "{message}");
}

#[tokio::test]
async fn required_placement_group_asks_all_or_nothing() {
    let mut c = cloud(vec![region("eu-central-1", "EU", vec![offering("h100", OnDemand, 98, 4)])]);
    c.regions[0].quota_nodes = Some(1);
    let mut spec = claim(2, &[OnDemand], &["h100"], &["EU"]);
    spec.topology = Some(ClaimTopology { same_zone: false, placement_group: PlacementGroupMode::Required });
    let mut h = Harness::new(c, spec);
    h.step().await;
    let calls = h.sim.calls().acquire;
    assert!(calls.iter().all(|r| r.placement_group && r.min_nodes == 2 && r.nodes == 2), "{calls:?}");
    assert!(h.status.allocations.is_empty(), "no partial grant under a required placement group");
    assert_eq!(h.condition(condition::FULFILLED).1, reason::QUOTA_EXCEEDED);
}

#[tokio::test]
async fn selector_only_alternative_matches_offering_devices() {
    let mut c = cloud(vec![region(
        "eu-central-1",
        "EU",
        vec![offering("h200", OnDemand, 120, 2), offering("h100", OnDemand, 98, 2)],
    )]);
    c.provisioning_delay = Duration::ZERO;
    let mut spec = claim(1, &[OnDemand], &[], &["EU"]);
    spec.capacity.device_classes = vec![ClaimDeviceClass {
        class: None,
        selectors: vec![CelExpression(
            r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("100Gi")) >= 0"#.into(),
        )],
    }];
    let mut h = Harness::new(c, spec);
    h.step().await;
    assert_eq!(h.status.allocations[0].class, "h200", "only H200 has >= 100Gi, though H100 is cheaper");
    assert!(h.sim.calls().acquire.iter().all(|r| r.instance_types == ["p5e.48xlarge"]));
}

#[tokio::test]
async fn unknown_class_is_an_invalid_spec_and_asks_nothing() {
    let mut h = Harness::new(split_zones_cloud(), claim(1, &[OnDemand], &["b200"], &["EU"]));
    h.step().await;
    let (_, why, message) = h.condition(condition::FULFILLED);
    assert_eq!(why, reason::INVALID_SPEC);
    assert!(message.contains("spec.capacity.deviceClasses[0].class"), "{message}");
    assert_eq!(h.sim.calls().total(), 0);
}

fn static_fleet() -> StaticProvider {
    StaticProvider::new(vec![("fra-dc".into(), static_cluster())], classes())
}

fn static_cluster() -> InferenceClusterSpec {
    InferenceClusterSpec {
        provider: ClusterProvider { aws: None, static_: Some(StaticCluster::default()), sim: None },
        region: "onprem-fra".into(),
        zones: vec!["rack-1".into()],
        jurisdiction: JurisdictionCode("EU".into()),
        country: Some("DE".into()),
        credentials: None,
        cluster_profile_ref: None,
        endpoint: None,
        cache_storage_class_name: None,
        deletion_policy: None,
        endpoint_auth: None,
        gateway_ref: None,
        pools: vec![NodePool {
            name: "h100".into(),
            class: "h100".into(),
            min_nodes: 0,
            max_nodes: 4,
            nodes: Some(2),
            capacity_types: vec![Reserved],
            reservation_ids: Vec::new(),
        }],
        taints: Vec::new(),
        cordoned: false,
    }
}

#[tokio::test]
async fn static_provider_offers_declared_pools_and_refuses_more() {
    let p = static_fleet();
    let offerings = p.offerings("onprem-fra").await.unwrap();
    assert_eq!(offerings.len(), 1);
    assert_eq!((offerings[0].available_nodes, offerings[0].devices_per_node), (Some(2), 8));
    let request = |name: &str, nodes: u32| AcquireRequest {
        name: name.into(),
        region: "onprem-fra".into(),
        zones: Vec::new(),
        instance_types: vec!["h100".into()],
        capacity_type: Reserved,
        nodes,
        min_nodes: nodes,
        placement_group: false,
        reservation_id: None,
        class: "h100".into(),
        cluster: None,
        labels: BTreeMap::new(),
        taints: Vec::new(),
    };
    let err = p.acquire(&request("too-many", 3)).await.unwrap_err();
    assert_eq!((err.kind(), err.code()), (ErrorKind::InsufficientCapacity, "StaticPoolExhausted"));
    let got = p.acquire(&request("two", 2)).await.unwrap();
    assert_eq!(got.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["fra-dc-h100-0", "fra-dc-h100-1"]);
    let err = p.acquire(&request("one-more", 1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InsufficientCapacity, "pool exhausted");
    p.release("onprem-fra", "two").await.unwrap();
    assert!(p.acquire(&request("after-release", 1)).await.is_ok());
}

#[tokio::test]
async fn a_provider_set_searches_a_static_site_and_a_cloud_in_one_step() {
    use std::sync::Arc;
    let mut c = cloud(vec![region("eu-central-1", "EU", vec![offering("h100", OnDemand, 98, 4)])]);
    c.provisioning_delay = Duration::ZERO;
    let h = Harness::new(c, claim(3, &[Reserved, OnDemand], &["h100"], &["EU"]));
    let set = ProviderSet::new(vec![Arc::new(static_fleet()), h.sim.clone()]).unwrap();
    let out = h.engine.step(h.input(), &set).await;
    let got: Vec<_> = out.status.allocations.iter().map(|a| (a.cluster.as_str(), a.capacity_type, a.nodes)).collect();
    assert_eq!(got, [("fra-dc", Some(Reserved), 2), ("cl-eu-central-1", Some(OnDemand), 1)], "the declared site first");
    let walk: Vec<_> = out
        .status
        .attempts
        .iter()
        .map(|a| format!("{} {} {}", a.provider, a.capacity_type.unwrap().as_str(), a.result))
        .collect();
    assert_eq!(
        walk,
        [
            "static reserved PartiallyFulfilled",
            "sim reserved NoOffering",
            "static on-demand NoOffering",
            "sim on-demand Fulfilled"
        ]
    );
    assert!(ProviderSet::new(vec![h.sim.clone(), h.sim.clone()]).is_err(), "one provider per region name");
}

/// Two static clusters at one site (same region), each with a pool named `h100`.
fn two_clusters_one_site() -> StaticProvider {
    let mut second = static_cluster();
    second.zones = vec!["rack-2".into()];
    second.pools[0].nodes = Some(1);
    StaticProvider::new(vec![("fra-dc".into(), static_cluster()), ("fra-dc-2".into(), second)], classes())
}

#[tokio::test]
async fn two_static_clusters_in_one_region_are_each_offered_and_acquired_as_themselves() {
    use std::sync::Arc;
    let p = two_clusters_one_site();
    let regions = p.regions();
    assert_eq!(
        regions.iter().map(|r| (r.name.as_str(), r.cluster.as_str())).collect::<Vec<_>>(),
        [("onprem-fra", "fra-dc"), ("onprem-fra", "fra-dc-2")]
    );
    let offerings = p.offerings("onprem-fra").await.unwrap();
    let by_cluster: Vec<_> =
        offerings.iter().map(|o| (o.cluster.as_deref(), o.zone.as_str(), o.available_nodes)).collect();
    assert_eq!(by_cluster, [(Some("fra-dc"), "rack-1", Some(2)), (Some("fra-dc-2"), "rack-2", Some(1))]);
    // One provider listing a region twice is one site, not a clash; two providers are.
    let set = ProviderSet::new(vec![Arc::new(two_clusters_one_site())]).unwrap();
    assert!(ProviderSet::new(vec![Arc::new(two_clusters_one_site()), Arc::new(static_fleet())]).is_err());
    // A claim for 3 nodes takes both of the first cluster's and the second's one, each
    // recorded in the cluster whose pool it is; the region is searched once.
    let h = Harness::new(cloud(vec![]), claim(3, &[Reserved], &["h100"], &["EU"]));
    let out = h.engine.step(h.input(), &set).await;
    let got: Vec<_> = out.status.allocations.iter().map(|a| (a.cluster.as_str(), a.nodes)).collect();
    assert_eq!(got, [("fra-dc", 2), ("fra-dc-2", 1)], "{:?}", out.status.attempts);
    assert_eq!(h_condition(&out), "True");
    // Without naming the cluster, a request is ambiguous rather than silently the first.
    let request = AcquireRequest {
        name: "no-cluster".into(),
        region: "onprem-fra".into(),
        zones: Vec::new(),
        instance_types: vec!["h100".into()],
        capacity_type: Reserved,
        nodes: 1,
        min_nodes: 1,
        placement_group: false,
        reservation_id: None,
        class: "h100".into(),
        cluster: None,
        labels: BTreeMap::new(),
        taints: Vec::new(),
    };
    let err = two_clusters_one_site().acquire(&request).await.unwrap_err();
    assert_eq!(err.code(), "StaticClusterAmbiguous");
}

fn h_condition(out: &flotilla_providers::ClaimStep) -> String {
    out.status.conditions.get(condition::FULFILLED).map(|c| c.status.clone()).unwrap_or_default()
}

#[tokio::test]
async fn sim_resize_grows_within_zone_capacity_and_shrinks() {
    let mut c = cloud(vec![region("eu-central-1", "EU", vec![offering("h100", OnDemand, 98, 3)])]);
    c.provisioning_delay = Duration::ZERO;
    let mut h = Harness::new(c, claim(1, &[OnDemand], &["h100"], &["EU"]));
    h.step().await;
    let id = h.status.allocations[0].pool.clone();
    let grown = h.sim.resize("eu-central-1", &id, 3).await.unwrap();
    assert_eq!((grown.nodes_granted, grown.nodes.len()), (3, 3));
    let err = h.sim.resize("eu-central-1", &id, 4).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InsufficientCapacity, "the zone has 3 nodes");
    let shrunk = h.sim.resize("eu-central-1", &id, 1).await.unwrap();
    assert_eq!(shrunk.nodes, grown.nodes[..1], "scale-down keeps the oldest node");
    let unsupported = static_fleet().resize("onprem-fra", "x", 1).await.unwrap_err();
    assert_eq!(unsupported.code(), "ResizeUnsupported");
}
