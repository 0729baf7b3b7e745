//! The AWS adapter against a real AWS emulator: `moto` in server mode on a free loopback port,
//! started once per test binary (installed by scripts/setup.sh; `FLOTILLA_MOTO_SERVER`
//! overrides the path). Covers what moto implements: instance types with GPU info, offerings
//! per zone, spot price history, EKS clusters and managed node groups. Fake static
//! credentials only; the standard credential chain is never consulted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use aws_sdk_eks::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_eks::types::{CapacityTypes, VpcConfigRequest};
use flotilla_apis::common::{CapacityType, TaintEffect};
use flotilla_providers::aws::{AwsProvider, AwsSettings, AwsTarget};
use flotilla_providers::{AcquireRequest, AcquisitionState, CapacityProvider, ErrorKind, NodeTaint};

mod moto;

const REGION: &str = "us-east-1";

/// The moto server's URL; starts it on first use. Fails (never skips) when moto is missing.
fn moto() -> &'static str {
    // The watchdog's handle lives as long as the test process; the watchdog reaps moto.
    static SERVER: OnceLock<(String, std::process::Child)> = OnceLock::new();
    &SERVER.get_or_init(moto::start).0
}

fn target(eks_cluster: &str) -> AwsTarget {
    AwsTarget {
        cluster: "us-va-1".into(),
        eks_cluster: eks_cluster.into(),
        region: REGION.into(),
        jurisdiction: "US".into(),
        subnets: BTreeMap::from([
            ("us-east-1a".to_string(), "subnet-0a".to_string()),
            ("us-east-1b".to_string(), "subnet-0b".to_string()),
        ]),
        node_role_arn: "arn:aws:iam::123456789012:role/flotilla-nodes".into(),
        instance_types: vec!["p5.48xlarge".into(), "g5.xlarge".into(), "m5.large".into()],
        reservations: false,
    }
}

async fn provider(eks_cluster: &str) -> AwsProvider {
    AwsProvider::connect(AwsSettings {
        targets: vec![target(eks_cluster)],
        endpoint_url: Some(moto().to_string()),
        static_credentials: Some(("testing".into(), "testing".into())),
        max_attempts: 2,
        initial_backoff: Duration::from_millis(10),
        on_demand_prices: BTreeMap::from([("p5.48xlarge".to_string(), 98_320_000)]),
    })
    .await
}

fn eks() -> aws_sdk_eks::Client {
    aws_sdk_eks::Client::from_conf(
        aws_sdk_eks::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(aws_smithy_http_client::Builder::new().build_http())
            .region(Region::new(REGION))
            .endpoint_url(moto())
            .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
            .build(),
    )
}

async fn create_cluster(name: &str) {
    eks()
        .create_cluster()
        .name(name)
        .role_arn("arn:aws:iam::123456789012:role/eks")
        .resources_vpc_config(VpcConfigRequest::builder().subnet_ids("subnet-0a").subnet_ids("subnet-0b").build())
        .send()
        .await
        .unwrap();
}

fn request(name: &str, capacity_type: CapacityType) -> AcquireRequest {
    AcquireRequest {
        name: name.into(),
        region: REGION.into(),
        zones: vec!["us-east-1a".into()],
        instance_types: vec!["p5.48xlarge".into()],
        capacity_type,
        nodes: 2,
        min_nodes: 1,
        placement_group: false,
        reservation_id: None,
        class: "h100".into(),
        cluster: None,
        labels: BTreeMap::from([("flotilla.dev/claim".to_string(), "ml.llama".to_string())]),
        taints: vec![NodeTaint {
            key: "flotilla.dev/claim".into(),
            value: "ml.llama".into(),
            effect: TaintEffect::NoSchedule,
        }],
    }
}

#[tokio::test]
async fn discovers_gpu_offerings_per_zone_with_spot_prices() {
    let p = provider("unused").await;
    let offerings = p.offerings(REGION).await.unwrap();
    assert!(offerings.iter().all(|o| o.instance_type != "m5.large"), "no GPU, no offering");
    let p5: Vec<_> = offerings.iter().filter(|o| o.instance_type == "p5.48xlarge").collect();
    assert!(!p5.is_empty(), "moto lists p5.48xlarge in {REGION}: {offerings:?}");
    assert!(p5.iter().all(|o| ["us-east-1a", "us-east-1b"].contains(&o.zone.as_str())), "only zones with a subnet");
    let on_demand = p5.iter().find(|o| o.capacity_type == CapacityType::OnDemand).unwrap();
    assert_eq!(on_demand.devices_per_node, 8);
    assert_eq!(on_demand.device.driver, "gpu.nvidia.com");
    assert_eq!(on_demand.device.attributes["productName"].string.as_deref(), Some("NVIDIA H100"));
    assert_eq!(on_demand.device.capacity["memory"].0, "81920Mi");
    assert_eq!(on_demand.price_micros, Some(98_320_000));
    let spot = p5.iter().find(|o| o.capacity_type == CapacityType::Spot).expect("spot offering from price history");
    assert!(spot.price_micros.is_some());
    let g5 = offerings.iter().find(|o| o.instance_type == "g5.xlarge").unwrap();
    assert_eq!((g5.devices_per_node, g5.device.attributes["productName"].string.as_deref()), (1, Some("NVIDIA A10G")));
}

#[tokio::test]
async fn node_group_lifecycle_create_describe_repeat_release() {
    create_cluster("lifecycle").await;
    let p = provider("lifecycle").await;
    let acq = p.acquire(&request("ml-llama-spot", CapacityType::Spot)).await.unwrap();
    assert_eq!(acq.id, "ml-llama-spot");
    assert_eq!(acq.nodes_granted, 2);
    assert_eq!(acq.capacity_type, CapacityType::Spot);
    assert_eq!(acq.zone.as_deref(), Some("us-east-1a"));
    assert_eq!(acq.class, "h100");

    let raw =
        eks().describe_nodegroup().cluster_name("lifecycle").nodegroup_name("ml-llama-spot").send().await.unwrap();
    let ng = raw.nodegroup().unwrap();
    assert_eq!(ng.capacity_type(), Some(&CapacityTypes::Spot));
    assert_eq!(ng.subnets(), ["subnet-0a"], "only the requested zone's subnet");
    assert_eq!(ng.labels().unwrap()["flotilla.dev/claim"], "ml.llama");
    assert_eq!(ng.taints()[0].key(), Some("flotilla.dev/claim"));
    assert_eq!(ng.instance_types(), ["p5.48xlarge"]);

    let again = p.acquire(&request("ml-llama-spot", CapacityType::Spot)).await.unwrap();
    assert_eq!(again.id, acq.id, "a repeated request finds the node group");
    let listed = eks().list_nodegroups().cluster_name("lifecycle").send().await.unwrap();
    assert_eq!(listed.nodegroups().len(), 1, "and creates no second one");

    let resized = p.resize(REGION, "ml-llama-spot", 4).await.unwrap();
    assert_eq!(resized.nodes_granted, 4, "scaled through UpdateNodegroupConfig");

    let described = p.describe(REGION, "ml-llama-spot").await.unwrap();
    assert!(matches!(described.state, AcquisitionState::Active | AcquisitionState::Provisioning));

    p.release(REGION, "ml-llama-spot").await.unwrap();
    p.release(REGION, "ml-llama-spot").await.unwrap();
    let listed = eks().list_nodegroups().cluster_name("lifecycle").send().await.unwrap();
    assert!(listed.nodegroups().is_empty(), "released");
}

#[tokio::test]
async fn on_demand_request_creates_an_on_demand_node_group() {
    create_cluster("ondemand").await;
    let p = provider("ondemand").await;
    p.acquire(&request("ml-llama-od", CapacityType::OnDemand)).await.unwrap();
    let raw = eks().describe_nodegroup().cluster_name("ondemand").nodegroup_name("ml-llama-od").send().await.unwrap();
    assert_eq!(raw.nodegroup().unwrap().capacity_type(), Some(&CapacityTypes::OnDemand));
}

#[tokio::test]
async fn missing_cluster_is_a_typed_error_with_the_aws_code() {
    let p = provider("no-such-cluster").await;
    let err = p.acquire(&request("x", CapacityType::OnDemand)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert_eq!(err.code(), "ResourceNotFoundException");
    let err = p.offerings("eu-west-3").await.unwrap_err();
    assert_eq!(err.code(), "UnknownRegion", "no target for that region, no call");
}

#[tokio::test]
async fn claim_engine_obtains_an_eks_node_group_through_moto() {
    use flotilla_apis::claim::{CapacityClaimSpec, CapacityPolicy, ClaimDeviceClass, PodSet};
    use flotilla_apis::class::{AwsProvisioning, InferenceClassSpec, Provisioning};
    use flotilla_apis::common::{DeviceSpec, JurisdictionCode, Sovereignty};
    use flotilla_apis::constants::condition;
    use flotilla_providers::{ClaimEngine, ClaimInput};
    use k8s_openapi::jiff::Timestamp;

    create_cluster("claims").await;
    let p = provider("claims").await;
    let classes = BTreeMap::from([(
        "h100".to_string(),
        InferenceClassSpec {
            device: DeviceSpec { driver: "gpu.nvidia.com".into(), ..Default::default() },
            devices_per_node: 8,
            provisioning: Provisioning { aws: Some(AwsProvisioning { instance_types: vec!["p5.48xlarge".into()] }) },
            price_per_node_hour: Default::default(),
        },
    )]);
    let mut spec = CapacityClaimSpec {
        pod_sets: vec![PodSet { name: "decode".into(), count: 2, devices_per_pod: 8 }],
        latency: None,
        topology: None,
        capacity: CapacityPolicy {
            capacity_types: vec![CapacityType::OnDemand],
            device_classes: vec![ClaimDeviceClass { class: Some("h100".into()), selectors: Vec::new() }],
            sovereignty: Some(Sovereignty {
                allowed_jurisdictions: vec![JurisdictionCode("EU".into())],
                ..Default::default()
            }),
            reservation_ids: Vec::new(),
        },
        disruption: None,
    };
    let now = Timestamp::now();
    let status = Default::default();
    let step = |spec: CapacityClaimSpec| {
        let (p, classes, status) = (&p, &classes, &status);
        async move {
            let input = ClaimInput {
                namespace: "ml",
                name: "llama",
                generation: Some(1),
                created: now,
                spec: &spec,
                status,
                classes,
                usage: &flotilla_providers::ClaimUsage::default(),
                now,
            };
            ClaimEngine::default().step(input, p).await
        }
    };
    // EU only: the US cluster is never asked, nothing is created.
    let out = step(spec.clone()).await;
    assert!(out.status.attempts.is_empty() && out.status.allocations.is_empty());
    let fulfilled = out.status.conditions.get(condition::FULFILLED).unwrap();
    assert_eq!((fulfilled.status.as_str(), fulfilled.reason.as_str()), ("False", "NoAllowedRegion"));
    assert!(fulfilled.message.contains("us-east-1 (US)"), "{}", fulfilled.message);
    let listed = eks().list_nodegroups().cluster_name("claims").send().await.unwrap();
    assert!(listed.nodegroups().is_empty());

    spec.capacity.sovereignty = None;
    let out = step(spec).await;
    assert_eq!(out.status.allocations.len(), 1, "{:?}", out.status);
    let alloc = &out.status.allocations[0];
    assert_eq!((alloc.cluster.as_str(), alloc.nodes, alloc.pods), ("us-va-1", 2, 2), "one 8-GPU pod per p5 node");
    let listed = eks().list_nodegroups().cluster_name("claims").send().await.unwrap();
    assert_eq!(listed.nodegroups(), std::slice::from_ref(&alloc.pool));
}

#[tokio::test]
async fn held_by_lists_the_claims_node_groups_and_release_all_deletes_them_without_a_status() {
    use flotilla_providers::ClaimEngine;

    create_cluster("heldby").await;
    let p = provider("heldby").await;
    p.acquire(&request("ml-llama-a", CapacityType::OnDemand)).await.unwrap();
    let mut other = request("ml-other-a", CapacityType::OnDemand);
    other.labels.insert("flotilla.dev/claim".into(), "ml.other".into());
    p.acquire(&other).await.unwrap();

    assert_eq!(p.held_by("ml.llama").await.unwrap(), [(REGION.to_string(), "ml-llama-a".to_string())]);
    assert!(p.held_by("ml.nobody").await.unwrap().is_empty());

    // The claim goes before its status recorded the node group.
    let failed = ClaimEngine::default().release_all("ml.llama", &Default::default(), &p).await;
    assert!(failed.is_empty(), "{failed:?}");
    assert!(p.held_by("ml.llama").await.unwrap().is_empty(), "nothing held for the claim");
    let listed = eks().list_nodegroups().cluster_name("heldby").send().await.unwrap();
    assert_eq!(listed.nodegroups(), ["ml-other-a"], "the other claim's node group is left alone");
}
