//! The claim engine against the simulated provider: ordered fallback over capacity types and
//! device classes, quota in one region sending the claim to the next, sovereignty (the
//! provider never hears of a foreign region), expiry, spot interruption and re-acquisition,
//! partial fulfilment, back-off counted in provider calls over injected time, and a status
//! that does not change when nothing happened.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use flotilla_apis::common::CapacityType::{OnDemand, Reserved, Spot};
use flotilla_apis::constants::{condition, reason};
use flotilla_providers::sim::FailureRule;
use flotilla_providers::{ErrorKind, ProviderError};
use support::*;

fn eu_us_cloud() -> flotilla_providers::SimCloud {
    cloud(vec![
        region("eu-central-1", "EU", vec![offering("h200", OnDemand, 120, 0), offering("h100", OnDemand, 98, 4)]),
        region("eu-west-1", "EU", vec![offering("h200", OnDemand, 125, 0), offering("h100", OnDemand, 99, 4)]),
        region("us-east-1", "US", vec![offering("h200", OnDemand, 90, 8), offering("h100", OnDemand, 80, 8)]),
    ])
}

#[tokio::test]
async fn reserved_refused_falls_back_to_on_demand_and_says_so() {
    let mut c = cloud(vec![region(
        "eu-central-1",
        "EU",
        vec![offering("h100", Reserved, 62, 4), offering("h100", OnDemand, 98, 4)],
    )]);
    c.provisioning_delay = Duration::ZERO;
    let mut h = Harness::new(c, claim(2, &[Reserved, OnDemand], &["h100"], &["EU"]));
    h.sim.add_failure(
        FailureRule::always(ProviderError::new(
            ErrorKind::InsufficientCapacity,
            "InsufficientInstanceCapacity",
            "reservation has no free instances",
        ))
        .for_capacity_type(Reserved),
    );
    h.step().await;
    let acquired: Vec<_> = h.sim.calls().acquire.iter().map(|r| r.capacity_type).collect();
    assert_eq!(acquired, [Reserved, Reserved, OnDemand], "reserved in both zones first, then on-demand");
    assert_eq!(
        h.results(),
        [
            "reserved h100 eu-central-1 InsufficientCapacity",
            "reserved h100 eu-central-1 InsufficientCapacity",
            "on-demand h100 eu-central-1 Fulfilled"
        ]
    );
    let (status, why, message) = h.condition(condition::FULFILLED);
    assert_eq!((status.as_str(), why.as_str()), ("True", reason::CLAIM_FALLBACK_SELECTED));
    assert!(message.contains("InsufficientInstanceCapacity"), "{message}");
    assert_eq!(h.status.devices_obtained, 16);
    assert_eq!(h.status.allocations[0].capacity_type, Some(OnDemand));
}

#[tokio::test]
async fn h200_unavailable_everywhere_allowed_falls_back_to_h100_never_leaving_the_eu() {
    let mut h = Harness::new(eu_us_cloud(), claim(2, &[OnDemand], &["h200", "h100"], &["EU"]));
    let first = h.step().await;
    assert_eq!(first.status.allocations.len(), 1);
    assert_eq!(first.status.allocations[0].class, "h100");
    assert_eq!(first.status.allocations[0].cluster, "cl-eu-central-1", "cheapest allowed region");
    // Provisioning first, Fulfilled with FallbackSelected once the nodes are ready.
    assert_eq!(h.condition(condition::FULFILLED).1, reason::PROVISIONING);
    assert_eq!(h.condition(condition::PROVISIONING).0, "True");
    h.clock.advance(first.requeue_after.max(Duration::from_secs(30)));
    h.step().await;
    let (status, why, message) = h.condition(condition::FULFILLED);
    assert_eq!((status.as_str(), why.as_str()), ("True", reason::CLAIM_FALLBACK_SELECTED));
    assert!(message.contains("h200 in eu-central-1: NoOffering") && message.contains("h200 in eu-west-1"), "{message}");
    // A fulfilled claim looked at again later (resync) writes nothing.
    h.clock.advance(Duration::from_secs(600));
    assert!(!h.step().await.changed);
    // H200 is cheap and plentiful in us-east-1, but the US is not allowed: never asked.
    let calls = h.sim.calls();
    assert!(!calls.regions().contains(&"us-east-1".to_string()), "provider heard of us-east-1: {calls:?}");
    assert!(calls.acquire.iter().all(|r| r.instance_types == ["p5.48xlarge"]), "no H200 offered in the EU");
    // The nodes to materialise carry the class, claim and a taint tying them to the claim.
    let nodes = &h.last.as_ref().unwrap().acquisitions[0].nodes;
    assert_eq!(nodes.len(), 2);
    assert!(nodes.iter().all(|n| n.ready && n.labels["flotilla.dev/class"] == "h100"));
    assert!(nodes.iter().all(|n| n.labels["flotilla.dev/claim"] == "ml.llama"));
    assert_eq!(nodes[0].taints[0].key, "flotilla.dev/claim");
}

#[tokio::test]
async fn quota_in_one_region_moves_to_the_next_allowed_region() {
    let mut c = eu_us_cloud();
    c.regions[0].quota_nodes = Some(0);
    let mut h = Harness::new(c, claim(2, &[OnDemand], &["h100"], &["EU"]));
    h.step().await;
    assert_eq!(h.results(), ["on-demand h100 eu-central-1 QuotaExceeded", "on-demand h100 eu-west-1 Fulfilled"]);
    assert!(h.status.attempts[0].message.starts_with("VcpuLimitExceeded:"), "{:?}", h.status.attempts[0]);
    assert_eq!(h.status.allocations[0].cluster, "cl-eu-west-1");
    // Quota is regional: the other zone of eu-central-1 was not tried after the refusal.
    let in_central = h.sim.calls().acquire.iter().filter(|r| r.region == "eu-central-1").count();
    assert_eq!(in_central, 1);
    assert!(!h.sim.calls().regions().contains(&"us-east-1".to_string()));
}

#[tokio::test]
async fn quota_everywhere_allowed_is_reported_as_quota_exceeded() {
    let mut c = eu_us_cloud();
    c.regions[0].quota_nodes = Some(0);
    c.regions[1].quota_nodes = Some(0);
    let mut h = Harness::new(c, claim(2, &[OnDemand], &["h100"], &["EU"]));
    h.step().await;
    let (status, why, message) = h.condition(condition::FULFILLED);
    assert_eq!((status.as_str(), why.as_str()), ("False", reason::QUOTA_EXCEEDED));
    assert!(
        message.contains("eu-central-1") && message.contains("eu-west-1") && message.contains("quota"),
        "{message}"
    );
    assert!(h.status.allocations.is_empty());
}

#[tokio::test]
async fn expires_after_max_provisioning_latency_and_then_stops_asking() {
    let mut h = Harness::new(eu_us_cloud(), claim(2, &[OnDemand], &["h200"], &["EU"]));
    h.run_for(Duration::from_secs(14 * 60)).await;
    assert_eq!(h.condition(condition::FULFILLED).1, reason::CAPACITY_UNAVAILABLE);
    h.run_for(Duration::from_secs(2 * 60)).await;
    let (status, why, message) = h.condition(condition::FULFILLED);
    assert_eq!((status.as_str(), why.as_str()), ("False", reason::EXPIRED), "{message}");
    assert!(message.contains("maxProvisioningLatency 15m (counted from"), "{message}");
    let before = h.sim.calls().total();
    h.run_for(Duration::from_secs(3600)).await;
    assert_eq!(h.sim.calls().total(), before, "an expired claim asks the provider nothing");
    assert!(!h.last.as_ref().unwrap().changed, "and its status stays byte-identical");
    assert_eq!(h.condition(condition::FULFILLED).1, reason::EXPIRED);
}

#[tokio::test]
async fn spot_interruption_is_reported_then_capacity_is_reacquired() {
    let mut c = cloud(vec![region(
        "eu-central-1",
        "EU",
        vec![offering("h100", Spot, 39, 4), offering("h100", OnDemand, 98, 4)],
    )]);
    c.provisioning_delay = Duration::ZERO;
    let mut h = Harness::new(c, claim(2, &[Spot, OnDemand], &["h100"], &["EU"]));
    h.step().await;
    assert_eq!(h.condition(condition::FULFILLED).1, reason::FULFILLED);
    let spot_id = h.status.allocations[0].pool.clone();
    assert_eq!(h.status.allocations[0].capacity_type, Some(Spot));

    h.clock.advance(Duration::from_secs(60));
    h.sim.interrupt(&spot_id, flotilla_providers::Clock::now(&h.clock));
    let out = h.step().await;
    let (status, why, message) = h.condition(condition::FULFILLED);
    assert_eq!((status.as_str(), why.as_str()), ("False", reason::INTERRUPTED), "{message}");
    assert!(message.contains("spot interruption"), "{message}");
    assert!(h.status.allocations.is_empty());
    assert!(h.sim.calls().release.iter().any(|(_, id)| *id == spot_id), "interrupted capacity released");
    assert_eq!(out.requeue_after, Duration::from_secs(1));

    h.clock.advance(out.requeue_after);
    h.step().await;
    assert_eq!(h.status.allocations.len(), 1);
    assert_ne!(h.status.allocations[0].pool, spot_id);
    assert_eq!(h.status.allocations[0].capacity_type, Some(OnDemand), "interrupted spot offering is cooling down");
    assert_eq!(h.condition(condition::FULFILLED).0, "True");
    assert_eq!(h.status.attempts.last().unwrap().result, "Fulfilled");
}

#[tokio::test]
async fn capacity_block_end_interrupts_too() {
    let mut c = cloud(vec![region("eu-central-1", "EU", vec![offering("h100", Reserved, 62, 4)])]);
    c.provisioning_delay = Duration::ZERO;
    c.regions[0].offerings[0].ends_at = Some(flotilla_providers::clock::add(t0(), Duration::from_secs(3600)));
    let mut h = Harness::new(c, claim(1, &[Reserved], &["h100"], &["EU"]));
    h.step().await;
    assert_eq!(h.condition(condition::FULFILLED).0, "True");
    h.clock.advance(Duration::from_secs(3601));
    h.step().await;
    let (_, why, message) = h.condition(condition::FULFILLED);
    assert_eq!(why, reason::INTERRUPTED);
    assert!(message.contains("capacity block end"), "{message}");
}

#[tokio::test]
async fn partial_capacity_is_kept_and_reported_as_partial() {
    let mut c = cloud(vec![region("eu-central-1", "EU", vec![offering("h100", OnDemand, 98, 4)])]);
    c.regions[0].quota_nodes = Some(3);
    c.provisioning_delay = Duration::ZERO;
    let mut h = Harness::new(c, claim(5, &[OnDemand], &["h100"], &["EU"]));
    h.step().await;
    let (status, why, message) = h.condition(condition::FULFILLED);
    assert_eq!((status.as_str(), why.as_str()), ("False", reason::PARTIALLY_FULFILLED), "{message}");
    assert_eq!(h.status.devices_requested, 40);
    assert_eq!(h.status.devices_obtained, 24);
    assert!(message.contains("decode 3 of 5 pods"), "{message}");
    assert_eq!(h.condition(condition::READY).0, "False", "partial is never Ready");
}

#[tokio::test]
async fn an_unfulfillable_claim_backs_off_instead_of_hammering_the_provider() {
    let mut h = Harness::new(eu_us_cloud(), claim(2, &[OnDemand], &["h100"], &["EU"]));
    h.spec.latency = None;
    h.sim.add_failure(FailureRule::always(ProviderError::new(
        ErrorKind::InsufficientCapacity,
        "InsufficientInstanceCapacity",
        "none left",
    )));
    let steps = h.run_for(Duration::from_secs(2 * 3600)).await;
    let acquires = h.sim.calls().acquire.len();
    eprintln!("{acquires} acquisitions over {steps} steps");
    // 4 offerings (2 regions × 2 zones) per round; rounds after 0, 3, 9, 21, 45, 75, 105 min.
    assert!(acquires >= 8, "it keeps trying: {acquires}");
    assert!(acquires <= 4 * 7, "{acquires} acquisitions in 2 h over {steps} steps");
    // A controller woken every 10 s by unrelated events asks nothing more while cooling down.
    h.step().await;
    let before = h.sim.calls().total();
    for _ in 0..12 {
        h.clock.advance(Duration::from_secs(10));
        let out = h.step().await;
        assert!(!out.changed, "nothing happened, nothing to write");
    }
    assert_eq!(h.sim.calls().total(), before);
}

#[tokio::test]
async fn same_inputs_same_status_and_no_write() {
    let mut h = Harness::new(eu_us_cloud(), claim(2, &[OnDemand], &["h200"], &["EU"]));
    let first = h.step().await;
    assert!(first.changed);
    let again = h.step().await;
    assert!(!again.changed);
    assert_eq!(first.status, again.status);
}

#[tokio::test]
async fn sim_node_names_follow_the_seed() {
    let names = |seed: u64| async move {
        let mut c = eu_us_cloud();
        c.seed = seed;
        let mut h = Harness::new(c, claim(1, &[OnDemand], &["h100"], &["EU"]));
        h.step().await;
        h.last.unwrap().acquisitions[0].nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!(names(1).await, names(1).await);
    assert_ne!(names(1).await, names(2).await);
}

#[tokio::test]
async fn step_runs_in_a_spawned_task_through_arc_dyn_provider() {
    // Controllers reconcile in spawned tasks: the step future must be Send, the trait object shareable.
    let h = Harness::new(eu_us_cloud(), claim(1, &[OnDemand], &["h100"], &["EU"]));
    let provider: std::sync::Arc<dyn flotilla_providers::CapacityProvider> = h.sim.clone();
    let engine = std::sync::Arc::new(flotilla_providers::ClaimEngine::default());
    let (spec, classes) = (h.spec.clone(), h.classes.clone());
    let out = tokio::spawn(async move {
        let status = Default::default();
        let input = flotilla_providers::ClaimInput {
            namespace: "ml",
            name: "llama",
            generation: Some(1),
            created: t0(),
            spec: &spec,
            status: &status,
            classes: &classes,
            usage: &flotilla_providers::ClaimUsage::default(),
            now: t0(),
        };
        engine.step(input, provider.as_ref()).await
    })
    .await
    .unwrap();
    assert_eq!(out.status.allocations.len(), 1);
}

#[tokio::test]
async fn throttling_backs_off_exponentially_then_recovers() {
    let mut h = Harness::new(eu_us_cloud(), claim(1, &[OnDemand], &["h100"], &["EU"]));
    h.sim.add_failure(
        FailureRule::always(ProviderError::new(ErrorKind::Throttled, "RequestLimitExceeded", "slow down")).times(2),
    );
    let first = h.step().await;
    assert_eq!(h.condition(condition::FULFILLED).1, reason::PROVIDER_UNAVAILABLE);
    assert_eq!(h.sim.calls().acquire.len(), 1, "a throttled step stops at the first refusal");
    assert_eq!(first.requeue_after, Duration::from_secs(5));
    h.clock.advance(first.requeue_after);
    let second = h.step().await;
    assert_eq!(second.requeue_after, Duration::from_secs(10), "doubles");
    h.clock.advance(second.requeue_after);
    h.step().await;
    assert_eq!(h.status.allocations.len(), 1, "recovers once the provider answers");
}

#[tokio::test]
async fn refused_credentials_stop_the_search() {
    let mut h = Harness::new(eu_us_cloud(), claim(1, &[OnDemand], &["h100"], &["EU"]));
    h.sim.add_failure(FailureRule::always(ProviderError::new(ErrorKind::Unauthorized, "AuthFailure", "bad keys")));
    h.step().await;
    let (_, why, message) = h.condition(condition::FULFILLED);
    assert_eq!(why, reason::PROVIDER_UNAUTHORIZED);
    assert!(message.contains("AuthFailure") && message.contains("credentials"), "{message}");
    assert_eq!(h.sim.calls().acquire.len(), 1, "no other region is tried with refused credentials");
}

#[tokio::test]
async fn a_named_reservation_the_provider_does_not_hold_is_a_reservation_mismatch() {
    let c = cloud(vec![region("eu-central-1", "EU", vec![offering("h100", Reserved, 62, 4)])]);
    let mut spec = claim(1, &[Reserved], &["h100"], &["EU"]);
    spec.capacity.reservation_ids = vec!["cr-0ther".into()];
    let mut h = Harness::new(c, spec);
    h.step().await;
    let (_, why, message) = h.condition(condition::FULFILLED);
    assert_eq!(why, reason::RESERVATION_MISMATCH, "{message}");
    assert!(message.contains("cr-h100") && message.contains("cr-0ther"), "{message}");
    assert!(h.sim.calls().acquire.is_empty(), "nothing is acquired against another reservation");
}

/// A provider that answers like the simulated one but cannot list what a claim holds.
struct CannotList(std::sync::Arc<flotilla_providers::SimProvider>);

#[async_trait::async_trait]
impl flotilla_providers::CapacityProvider for CannotList {
    fn name(&self) -> &str {
        "sim"
    }
    fn regions(&self) -> Vec<flotilla_providers::RegionInfo> {
        self.0.regions()
    }
    async fn offerings(&self, region: &str) -> Result<Vec<flotilla_providers::Offering>, ProviderError> {
        self.0.offerings(region).await
    }
    async fn acquire(
        &self,
        request: &flotilla_providers::AcquireRequest,
    ) -> Result<flotilla_providers::Acquisition, ProviderError> {
        self.0.acquire(request).await
    }
    async fn describe(&self, region: &str, id: &str) -> Result<flotilla_providers::Acquisition, ProviderError> {
        self.0.describe(region, id).await
    }
    async fn release(&self, region: &str, id: &str) -> Result<(), ProviderError> {
        self.0.release(region, id).await
    }
    async fn held_by(&self, _claim: &str) -> Result<Vec<(String, String)>, ProviderError> {
        Err(ProviderError::new(ErrorKind::Throttled, "ThrottlingException", "Rate exceeded"))
    }
}

#[tokio::test]
async fn release_all_gives_back_what_was_acquired_before_the_first_status_write() {
    use flotilla_providers::{AcquisitionState, CapacityProvider};
    let mut c = cloud(vec![region("eu-central-1", "EU", vec![offering("h100", OnDemand, 98, 4)])]);
    c.provisioning_delay = Duration::ZERO;
    let mut h = Harness::new(c, claim(2, &[OnDemand], &["h100"], &["EU"]));
    let out = h.step().await;
    assert_eq!(out.status.allocations.len(), 1, "the step acquired capacity");
    // Another claim's acquisition in the same region, which must survive.
    let mut other = h.sim.calls().acquire[0].clone();
    other.name = "ml-other-decode".into();
    other.nodes = 1;
    other.labels.insert("flotilla.dev/claim".into(), "ml.other".into());
    h.sim.acquire(&other).await.unwrap();
    assert_eq!(h.sim.held_by("ml.llama").await.unwrap().len(), 1);

    // The status write never landed: the finalizer sees an empty status.
    let never_written = Default::default();
    let failed = h.engine.release_all("ml.llama", &never_written, h.sim.as_ref()).await;
    assert!(failed.is_empty(), "{failed:?}");
    assert!(h.sim.held_by("ml.llama").await.unwrap().is_empty(), "the provider holds nothing for the claim");
    let states: Vec<_> = h.sim.acquisitions().into_iter().map(|a| (a.id, a.state)).collect();
    let mine: Vec<_> = states.iter().filter(|(id, _)| *id != "ml-other-decode").collect();
    assert!(mine.iter().all(|(_, s)| *s == AcquisitionState::Released), "{states:?}");
    assert_eq!(h.sim.held_by("ml.other").await.unwrap(), [("eu-central-1".to_string(), "ml-other-decode".to_string())]);
    assert!(h.sim.calls().release.iter().all(|(_, id)| id != "ml-other-decode"), "the other claim's is left alone");

    // Released once, not twice, when the status does record it.
    let before = h.sim.calls().release.len();
    assert!(h.engine.release_all("ml.other", &h.status, h.sim.as_ref()).await.is_empty());
    let released: Vec<_> = h.sim.calls().release[before..].iter().map(|(_, id)| id.clone()).collect();
    assert!(released.contains(&"ml-other-decode".to_string()), "{released:?}");
    let mut deduped = released.clone();
    deduped.dedup();
    assert_eq!(released, deduped, "each acquisition released once");
}

#[tokio::test]
async fn release_all_reports_a_listing_failure_so_the_finalizer_retries() {
    let mut c = cloud(vec![region("eu-central-1", "EU", vec![offering("h100", OnDemand, 98, 4)])]);
    c.provisioning_delay = Duration::ZERO;
    let mut h = Harness::new(c, claim(2, &[OnDemand], &["h100"], &["EU"]));
    h.step().await;
    let provider = CannotList(h.sim.clone());
    let failed = h.engine.release_all("ml.llama", &h.status, &provider).await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].1.code(), "ThrottlingException");
    assert!(h.sim.calls().release.len() == 1, "what the status records is still released");
}
