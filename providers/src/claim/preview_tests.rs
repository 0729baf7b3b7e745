//! Unit tests of `preview`: the order follows capacity types, then device alternatives, then
//! regions, cheapest first within a region; regions outside the claim's sovereignty and
//! capacity types it does not name never appear.

use std::collections::BTreeMap;

use flotilla_apis::cel::SelectorEngine;
use flotilla_apis::claim::CapacityClaimSpec;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::common::CapacityType::{self, OnDemand, Reserved, Spot};

use super::{NoTry, Try, preview};
use crate::types::{Offering, RegionInfo};

fn classes() -> BTreeMap<String, InferenceClassSpec> {
    let class = |product: &str| -> InferenceClassSpec {
        serde_json::from_value(serde_json::json!({
            "device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": product}}},
            "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "100.00"}}))
        .unwrap()
    };
    BTreeMap::from([("h200".to_string(), class("NVIDIA H200")), ("h100".to_string(), class("NVIDIA H100 80GB HBM3"))])
}

fn spec(types: &[&str], jurisdictions: &[&str]) -> CapacityClaimSpec {
    serde_json::from_value(serde_json::json!({
        "podSets": [{"name": "replicas", "count": 3, "devicesPerPod": 4}],
        "capacity": {"capacityTypes": types, "deviceClasses": [{"class": "h200"}, {"class": "h100"}],
                     "sovereignty": {"allowedJurisdictions": jurisdictions}}}))
    .unwrap()
}

fn region(provider: &str, name: &str, jurisdiction: &str) -> RegionInfo {
    RegionInfo {
        provider: provider.into(),
        name: name.into(),
        jurisdiction: jurisdiction.into(),
        cluster: format!("{name}-cluster"),
        zones: vec![format!("{name}a")],
    }
}

fn offering(region: &str, ty: &str, class: &str, ct: CapacityType, dollars: u64) -> Offering {
    let classes = classes();
    Offering {
        region: region.into(),
        zone: format!("{region}a"),
        instance_type: ty.into(),
        capacity_type: ct,
        device: classes[class].device.clone(),
        devices_per_node: 8,
        price_micros: Some(dollars * 1_000_000),
        reservation_id: None,
        available_nodes: None,
        ends_at: None,
        class: Some(class.into()),
        cluster: None,
    }
}

fn regions() -> Vec<RegionInfo> {
    vec![region("static", "eu-a", "EU"), region("sim", "eu-b", "EU"), region("sim", "us-a", "US")]
}

fn offerings() -> Vec<Offering> {
    vec![
        // The cheapest of all, but in the US: never tried for an EU claim.
        offering("us-a", "us-h200", "h200", Reserved, 10),
        offering("us-a", "us-h100", "h100", OnDemand, 1),
        offering("eu-a", "a-h100", "h100", OnDemand, 90),
        offering("eu-a", "a-h200-dear", "h200", OnDemand, 100),
        offering("eu-a", "a-h200-cheap", "h200", OnDemand, 95),
        offering("eu-a", "a-h200-res", "h200", Reserved, 60),
        offering("eu-b", "b-h200", "h200", OnDemand, 80),
        offering("eu-b", "b-h100", "h100", OnDemand, 70),
        // Spot is not among the claim's capacity types.
        offering("eu-b", "b-h100-spot", "h100", Spot, 20),
    ]
}

fn order(tries: &[Try]) -> Vec<(CapacityType, &str, &str)> {
    tries.iter().map(|t| (t.capacity_type, t.class.as_str(), t.instance_type.as_str())).collect()
}

#[test]
fn order_is_capacity_types_then_alternatives_then_regions_cheapest_first() {
    let tries = preview(
        &spec(&["reserved", "on-demand"], &["EU"]),
        &classes(),
        &regions(),
        &offerings(),
        &SelectorEngine::new(),
    )
    .unwrap();
    assert_eq!(
        order(&tries),
        vec![
            (Reserved, "h200", "a-h200-res"),
            (OnDemand, "h200", "a-h200-cheap"),
            (OnDemand, "h200", "a-h200-dear"),
            (OnDemand, "h200", "b-h200"),
            (OnDemand, "h100", "a-h100"),
            (OnDemand, "h100", "b-h100"),
        ]
    );
    let first = &tries[0];
    assert_eq!(
        (first.region.as_str(), first.cluster.as_str(), first.provider.as_str()),
        ("eu-a", "eu-a-cluster", "static")
    );
    assert_eq!((first.zone.as_str(), first.fallback_rank, first.price_micros), ("eu-aa", 1, Some(60_000_000)));
    // 3 pods of 4 devices on nodes of 8: two pods a node, two nodes.
    assert!(tries.iter().all(|t| t.nodes == 2 && t.pod_set == "replicas"));
    assert_eq!(tries[4].fallback_rank, 2);
    // Absence: nothing outside the EU, nothing spot.
    assert!(tries.iter().all(|t| t.region != "us-a" && !t.instance_type.starts_with("us-")), "{tries:?}");
    assert!(tries.iter().all(|t| t.capacity_type != Spot));
}

#[test]
fn the_claims_capacity_type_order_wins_over_price() {
    let tries = preview(
        &spec(&["on-demand", "reserved"], &["EU"]),
        &classes(),
        &regions(),
        &offerings(),
        &SelectorEngine::new(),
    )
    .unwrap();
    assert_eq!(order(&tries)[0], (OnDemand, "h200", "a-h200-cheap"));
    assert_eq!(order(&tries).last(), Some(&(Reserved, "h200", "a-h200-res")));
}

#[test]
fn no_allowed_region_and_no_offering_say_why() {
    let engine = SelectorEngine::new();
    let err = preview(&spec(&["on-demand"], &["UK"]), &classes(), &regions(), &offerings(), &engine).unwrap_err();
    assert!(matches!(&err, NoTry::NoAllowedRegion(offered) if offered.len() == 3), "{err:?}");
    assert!(err.to_string().contains("eu-a (EU)"), "{err}");

    let err = preview(&spec(&["reserved"], &["EU"]), &classes(), &regions(), &[], &engine).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("no provider offers h200 or h100 as reserved"), "{text}");
    assert!(text.contains("(eu-a, eu-b)") && !text.contains("us-a"), "{text}");

    let mut invalid = spec(&["on-demand"], &["EU"]);
    invalid.capacity.device_classes[0].class = Some("b200".into());
    let err = preview(&invalid, &classes(), &regions(), &offerings(), &engine).unwrap_err();
    assert!(matches!(&err, NoTry::Invalid(m) if m.contains("InferenceClass b200 does not exist")), "{err:?}");
}

#[test]
fn offerings_without_free_nodes_or_room_for_a_pod_are_skipped() {
    let mut list = offerings();
    for o in &mut list {
        if o.instance_type == "a-h200-res" {
            o.available_nodes = Some(0);
        }
        if o.instance_type == "a-h200-cheap" {
            o.devices_per_node = 2;
        }
    }
    let tries =
        preview(&spec(&["reserved", "on-demand"], &["EU"]), &classes(), &regions(), &list, &SelectorEngine::new())
            .unwrap();
    assert_eq!(order(&tries)[0], (OnDemand, "h200", "a-h200-dear"));
}

#[tokio::test]
async fn gather_lists_only_allowed_regions_and_asks_for_nothing() {
    use std::sync::Arc;

    use crate::clock::ManualClock;
    use crate::sim::SimProvider;

    let yaml = r#"
regions:
- {name: eu-b, jurisdiction: EU, cluster: eu-b-cluster, zones: [eu-ba],
   offerings: [{instanceType: b-h200, class: h200, capacityType: on-demand, pricePerHour: "80.00", nodesPerZone: 4}]}
- {name: us-a, jurisdiction: US, cluster: us-a-cluster, zones: [us-aa],
   offerings: [{instanceType: us-h200, class: h200, capacityType: on-demand, pricePerHour: "1.00", nodesPerZone: 4}]}
"#;
    let cloud = crate::sim::file::load(yaml, &classes()).unwrap();
    let sim = SimProvider::new(cloud, Arc::new(ManualClock::new(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)));
    let spec = spec(&["on-demand"], &["EU"]);
    let (regions, offerings) = super::gather(&spec, &sim).await.unwrap();
    assert_eq!(regions.len(), 2);
    assert!(offerings.iter().all(|o| o.region == "eu-b"), "{offerings:?}");
    let tries = preview(&spec, &classes(), &regions, &offerings, &SelectorEngine::new()).unwrap();
    assert_eq!(order(&tries), vec![(OnDemand, "h200", "b-h200")]);
    assert_eq!((tries[0].provider.as_str(), tries[0].available_nodes), ("sim", Some(4)));
    // Absence: the US region was never asked, and nothing was acquired.
    let calls = sim.calls();
    assert_eq!(calls.offerings, vec!["eu-b".to_string()]);
    assert_eq!(calls.total(), 1);
}
