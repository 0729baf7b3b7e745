//! The AWS adapter against `aws-smithy-mocks` for what moto does not implement: capacity
//! reservations and capacity blocks, `InsufficientInstanceCapacity`, quota and authorization
//! errors, throttling with retries. Each AWS code is followed through the typed error into
//! the claim condition the engine writes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::error::ErrorMetadata;
use aws_sdk_ec2::operation::describe_capacity_reservations::{
    DescribeCapacityReservationsError, DescribeCapacityReservationsOutput,
};
use aws_sdk_ec2::operation::describe_instance_type_offerings::DescribeInstanceTypeOfferingsOutput;
use aws_sdk_ec2::operation::describe_instance_types::{DescribeInstanceTypesError, DescribeInstanceTypesOutput};
use aws_sdk_ec2::operation::describe_spot_price_history::DescribeSpotPriceHistoryOutput;
use aws_sdk_ec2::primitives::DateTime;
use aws_sdk_ec2::types::{
    CapacityReservation, CapacityReservationState, CapacityReservationType, GpuDeviceInfo, GpuDeviceMemoryInfo,
    GpuInfo, InstanceType, InstanceTypeInfo, InstanceTypeOffering, LocationType, SpotPrice,
};
use aws_sdk_eks::operation::create_nodegroup::{CreateNodegroupError, CreateNodegroupOutput};
use aws_sdk_eks::types::{
    CapacityTypes, Issue, Nodegroup, NodegroupHealth, NodegroupIssueCode, NodegroupScalingConfig, NodegroupStatus,
};
use aws_smithy_mocks::{Rule, RuleMode, mock};
use flotilla_apis::claim::{CapacityClaimSpec, CapacityPolicy, ClaimDeviceClass, PodSet};
use flotilla_apis::class::{AwsProvisioning, InferenceClassSpec, Provisioning};
use flotilla_apis::common::{CapacityType, DeviceSpec};
use flotilla_apis::constants::{condition, reason};
use k8s_openapi::jiff::Timestamp;

use super::{AwsProvider, AwsTarget};
use crate::claim::{ClaimEngine, ClaimInput};
use crate::error::ErrorKind;
use crate::provider::CapacityProvider;

const P5: &str = "p5.48xlarge";
const ZONE: &str = "eu-central-1a";

pub(super) fn target(reservations: bool) -> AwsTarget {
    AwsTarget {
        cluster: "eu-fra-1".into(),
        eks_cluster: "inference-fra".into(),
        region: "eu-central-1".into(),
        jurisdiction: "EU".into(),
        subnets: BTreeMap::from([(ZONE.to_string(), "subnet-a".to_string())]),
        node_role_arn: "arn:aws:iam::123456789012:role/nodes".into(),
        instance_types: vec![P5.into()],
        reservations,
    }
}

fn retries(c: aws_sdk_ec2::config::Builder) -> aws_sdk_ec2::config::Builder {
    c.retry_config(RetryConfig::standard().with_max_attempts(3).with_initial_backoff(Duration::from_millis(1)))
}

fn types_rule() -> Rule {
    mock!(aws_sdk_ec2::Client::describe_instance_types).then_output(|| {
        DescribeInstanceTypesOutput::builder()
            .instance_types(
                InstanceTypeInfo::builder()
                    .instance_type(InstanceType::from(P5))
                    .gpu_info(
                        GpuInfo::builder()
                            .gpus(
                                GpuDeviceInfo::builder()
                                    .name("H100")
                                    .manufacturer("NVIDIA")
                                    .count(8)
                                    .memory_info(GpuDeviceMemoryInfo::builder().size_in_mib(81920).build())
                                    .build(),
                            )
                            .build(),
                    )
                    .build(),
            )
            .build()
    })
}

fn offerings_rule() -> Rule {
    mock!(aws_sdk_ec2::Client::describe_instance_type_offerings).then_output(|| {
        DescribeInstanceTypeOfferingsOutput::builder()
            .instance_type_offerings(
                InstanceTypeOffering::builder()
                    .instance_type(InstanceType::from(P5))
                    .location(ZONE)
                    .location_type(LocationType::AvailabilityZone)
                    .build(),
            )
            .build()
    })
}

fn spot_rule() -> Rule {
    mock!(aws_sdk_ec2::Client::describe_spot_price_history).then_output(|| {
        DescribeSpotPriceHistoryOutput::builder()
            .spot_price_history(
                SpotPrice::builder()
                    .instance_type(InstanceType::from(P5))
                    .availability_zone(ZONE)
                    .spot_price("39.120000")
                    .timestamp(DateTime::from_secs(1_800_000_000))
                    .build(),
            )
            .build()
    })
}

fn reservation(kind: CapacityReservationType, ty: &str) -> CapacityReservation {
    CapacityReservation::builder()
        .capacity_reservation_id("cr-0abc")
        .instance_type(ty)
        .availability_zone(ZONE)
        .available_instance_count(2)
        .state(CapacityReservationState::Active)
        .reservation_type(kind)
        .end_date(DateTime::from_secs(4_000_000_000))
        .build()
}

fn nodegroup(name: &str, status: NodegroupStatus) -> Nodegroup {
    Nodegroup::builder()
        .nodegroup_name(name)
        .status(status)
        .instance_types(P5)
        .scaling_config(NodegroupScalingConfig::builder().desired_size(1).max_size(1).min_size(0).build())
        .tags("flotilla.dev/zone", ZONE)
        .tags("flotilla.dev/class", "h100")
        .build()
}

fn provider(ec2_rules: &[&Rule], eks_rules: &[&Rule], reservations: bool) -> AwsProvider {
    let ec2 = mocked_client!(aws_sdk_ec2, RuleMode::MatchAny, ec2_rules, retries);
    let eks = mocked_client!(aws_sdk_eks, RuleMode::MatchAny, eks_rules, |c: aws_sdk_eks::config::Builder| c
        .retry_config(
            aws_sdk_eks::config::retry::RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(Duration::from_millis(1))
        ));
    let asg = mocked_client!(aws_sdk_autoscaling, RuleMode::MatchAny, &[] as &[&Rule]);
    AwsProvider::from_clients(target(reservations), ec2, eks, asg)
}

fn classes() -> BTreeMap<String, InferenceClassSpec> {
    BTreeMap::from([(
        "h100".to_string(),
        InferenceClassSpec {
            device: DeviceSpec { driver: "gpu.nvidia.com".into(), ..Default::default() },
            devices_per_node: 8,
            provisioning: Provisioning { aws: Some(AwsProvisioning { instance_types: vec![P5.into()] }) },
            price_per_node_hour: Default::default(),
        },
    )])
}

fn claim(capacity_types: Vec<CapacityType>) -> CapacityClaimSpec {
    CapacityClaimSpec {
        pod_sets: vec![PodSet { name: "decode".into(), count: 1, devices_per_pod: 8 }],
        latency: None,
        topology: None,
        capacity: CapacityPolicy {
            capacity_types,
            device_classes: vec![ClaimDeviceClass { class: Some("h100".into()), selectors: Vec::new() }],
            sovereignty: None,
            reservation_ids: Vec::new(),
        },
        disruption: None,
    }
}

/// Runs one claim step and returns (attempt results, Fulfilled reason).
async fn step(p: &AwsProvider, spec: &CapacityClaimSpec) -> (Vec<String>, String) {
    let classes = classes();
    let status = Default::default();
    let out = ClaimEngine::default()
        .step(
            ClaimInput {
                namespace: "ml",
                name: "llama",
                generation: Some(1),
                created: Timestamp::from_second(1_800_000_000).unwrap(),
                spec,
                status: &status,
                classes: &classes,
                usage: &crate::ClaimUsage::default(),
                now: Timestamp::from_second(1_800_000_000).unwrap(),
            },
            p,
        )
        .await;
    let results = out.status.attempts.iter().map(|a| format!("{} {}", a.result, a.message)).collect();
    (results, out.status.conditions.get(condition::FULFILLED).unwrap().reason.clone())
}

#[tokio::test]
async fn discovery_maps_gpu_info_spot_prices_and_capacity_blocks() {
    let reservations = mock!(aws_sdk_ec2::Client::describe_capacity_reservations).then_output(|| {
        DescribeCapacityReservationsOutput::builder()
            .capacity_reservations(reservation(CapacityReservationType::CapacityBlock, P5))
            .build()
    });
    let p = provider(&[&types_rule(), &offerings_rule(), &spot_rule(), &reservations], &[], true);
    let offerings = p.offerings("eu-central-1").await.unwrap();
    let by_type: Vec<_> =
        offerings.iter().map(|o| (o.capacity_type, o.price_micros, o.reservation_id.clone())).collect();
    assert_eq!(
        by_type,
        [
            (CapacityType::Spot, Some(39_120_000), None),
            (CapacityType::OnDemand, None, None),
            (CapacityType::Reserved, Some(0), Some("cr-0abc".to_string())),
        ]
    );
    let device = &offerings[0].device;
    assert_eq!(device.driver, "gpu.nvidia.com");
    assert_eq!(device.attributes["productName"].string.as_deref(), Some("NVIDIA H100"));
    assert_eq!(device.capacity["memory"].0, "81920Mi");
    assert_eq!(offerings[0].devices_per_node, 8);
    assert_eq!(offerings[2].available_nodes, Some(2));
    assert!(offerings[2].ends_at.is_some(), "capacity block end is known");
}

#[tokio::test]
async fn capacity_block_is_acquired_as_capacity_block_node_group_with_launch_template() {
    let reservations = mock!(aws_sdk_ec2::Client::describe_capacity_reservations).then_output(|| {
        DescribeCapacityReservationsOutput::builder()
            .capacity_reservations(reservation(CapacityReservationType::CapacityBlock, P5))
            .build()
    });
    let template = mock!(aws_sdk_ec2::Client::create_launch_template)
        .match_requests(|r| {
            let data = r.launch_template_data().unwrap();
            data.capacity_reservation_specification()
                .and_then(|s| s.capacity_reservation_target())
                .and_then(|t| t.capacity_reservation_id())
                == Some("cr-0abc")
                && data.instance_market_options().and_then(|m| m.market_type()).map(|m| m.as_str())
                    == Some("capacity-block")
        })
        .then_output(|| aws_sdk_ec2::operation::create_launch_template::CreateLaunchTemplateOutput::builder().build());
    let create = mock!(aws_sdk_eks::Client::create_nodegroup)
        .match_requests(|r| {
            r.capacity_type() == Some(&CapacityTypes::CapacityBlock)
                && r.launch_template().and_then(|t| t.name()).is_some()
                && r.subnets() == ["subnet-a"]
                && r.labels().is_some_and(|l| l["flotilla.dev/claim"] == "ml.llama")
                && r.taints().iter().any(|t| t.key() == Some("flotilla.dev/claim"))
        })
        .then_compute_output(|r| {
            CreateNodegroupOutput::builder()
                .nodegroup(nodegroup(r.nodegroup_name().unwrap(), NodegroupStatus::Creating))
                .build()
        });
    let p = provider(&[&types_rule(), &offerings_rule(), &spot_rule(), &reservations, &template], &[&create], true);
    let (results, why) = step(&p, &claim(vec![CapacityType::Reserved])).await;
    assert_eq!(template.num_calls(), 1);
    assert_eq!(create.num_calls(), 1, "{results:?}");
    assert!(results[0].starts_with("Fulfilled"), "{results:?}");
    assert_eq!(why, reason::PROVISIONING);
}

#[tokio::test]
async fn reservation_of_another_type_is_a_reservation_mismatch_and_nothing_is_created() {
    // Discovery lists a p5 reservation; by the time it is checked it is for another type.
    let listing = mock!(aws_sdk_ec2::Client::describe_capacity_reservations)
        .match_requests(|r| r.capacity_reservation_ids().is_empty())
        .then_output(|| {
            DescribeCapacityReservationsOutput::builder()
                .capacity_reservations(reservation(CapacityReservationType::Default, P5))
                .build()
        });
    let check = mock!(aws_sdk_ec2::Client::describe_capacity_reservations)
        .match_requests(|r| !r.capacity_reservation_ids().is_empty())
        .then_output(|| {
            DescribeCapacityReservationsOutput::builder()
                .capacity_reservations(reservation(CapacityReservationType::Default, "p4d.24xlarge"))
                .build()
        });
    let create = mock!(aws_sdk_eks::Client::create_nodegroup).then_output(|| CreateNodegroupOutput::builder().build());
    let p = provider(&[&types_rule(), &offerings_rule(), &spot_rule(), &listing, &check], &[&create], true);
    let (results, why) = step(&p, &claim(vec![CapacityType::Reserved])).await;
    assert!(
        results[0].starts_with("ReservationMismatch ReservationMismatch: reservation cr-0abc is for p4d"),
        "{results:?}"
    );
    assert_eq!(why, reason::RESERVATION_MISMATCH);
    assert_eq!(create.num_calls(), 0, "no node group for a mismatched reservation");
}

#[tokio::test]
async fn unknown_reservation_id_code_is_a_reservation_mismatch() {
    let listing = mock!(aws_sdk_ec2::Client::describe_capacity_reservations)
        .match_requests(|r| r.capacity_reservation_ids().is_empty())
        .then_output(|| {
            DescribeCapacityReservationsOutput::builder()
                .capacity_reservations(reservation(CapacityReservationType::Default, P5))
                .build()
        });
    let check = mock!(aws_sdk_ec2::Client::describe_capacity_reservations)
        .match_requests(|r| !r.capacity_reservation_ids().is_empty())
        .then_error(|| {
            DescribeCapacityReservationsError::generic(
                ErrorMetadata::builder()
                    .code("InvalidCapacityReservationId.NotFound")
                    .message("The capacity reservation ID 'cr-0abc' does not exist")
                    .build(),
            )
        });
    let p = provider(&[&types_rule(), &offerings_rule(), &spot_rule(), &listing, &check], &[], true);
    let (results, why) = step(&p, &claim(vec![CapacityType::Reserved])).await;
    assert!(results[0].starts_with("ReservationMismatch InvalidCapacityReservationId.NotFound"), "{results:?}");
    assert_eq!(why, reason::RESERVATION_MISMATCH);
}

#[tokio::test]
async fn each_aws_code_reaches_the_right_typed_error_and_claim_reason() {
    for (code, kind, claim_reason) in [
        ("InsufficientInstanceCapacity", ErrorKind::InsufficientCapacity, reason::CAPACITY_UNAVAILABLE),
        ("VcpuLimitExceeded", ErrorKind::QuotaExceeded, reason::QUOTA_EXCEEDED),
        ("InstanceLimitExceeded", ErrorKind::QuotaExceeded, reason::QUOTA_EXCEEDED),
        ("ResourceLimitExceededException", ErrorKind::QuotaExceeded, reason::QUOTA_EXCEEDED),
        ("UnauthorizedOperation", ErrorKind::Unauthorized, reason::PROVIDER_UNAUTHORIZED),
        ("AccessDeniedException", ErrorKind::Unauthorized, reason::PROVIDER_UNAUTHORIZED),
        ("InvalidParameterException", ErrorKind::InvalidRequest, reason::PROVIDER_REJECTED),
        ("RequestLimitExceeded", ErrorKind::Throttled, reason::PROVIDER_UNAVAILABLE),
    ] {
        let create = mock!(aws_sdk_eks::Client::create_nodegroup).then_error(move || {
            CreateNodegroupError::generic(ErrorMetadata::builder().code(code).message("from the mock").build())
        });
        let p = provider(&[&types_rule(), &offerings_rule(), &spot_rule()], &[&create], false);
        let (results, why) = step(&p, &claim(vec![CapacityType::OnDemand])).await;
        assert_eq!(results.len(), 1, "{code}: {results:?}");
        assert!(
            results[0].starts_with(&format!("{} {code}: CreateNodegroup: from the mock", kind.as_str())),
            "{results:?}"
        );
        assert_eq!(why, claim_reason, "{code}");
        let expected_calls = if kind == ErrorKind::Throttled { 3 } else { 1 };
        assert_eq!(create.num_calls(), expected_calls, "{code}: retried only when throttled");
    }
}

#[tokio::test]
async fn throttling_is_retried_then_succeeds() {
    let types = mock!(aws_sdk_ec2::Client::describe_instance_types)
        .sequence()
        .error(|| {
            DescribeInstanceTypesError::generic(
                ErrorMetadata::builder().code("RequestLimitExceeded").message("Request limit exceeded.").build(),
            )
        })
        .times(2)
        .output(|| {
            DescribeInstanceTypesOutput::builder()
                .instance_types(InstanceTypeInfo::builder().instance_type(InstanceType::from("m5.large")).build())
                .build()
        })
        .build();
    let p = provider(&[&types], &[], false);
    let offerings = p.offerings("eu-central-1").await.unwrap();
    assert!(offerings.is_empty(), "m5.large has no GPU");
    assert_eq!(types.num_calls(), 3, "two throttled attempts, then success");
}

#[tokio::test]
async fn persistent_throttling_gives_up_as_throttled() {
    let types = mock!(aws_sdk_ec2::Client::describe_instance_types)
        .sequence()
        .error(|| {
            DescribeInstanceTypesError::generic(
                ErrorMetadata::builder().code("RequestLimitExceeded").message("Request limit exceeded.").build(),
            )
        })
        .repeatedly()
        .build();
    let p = provider(&[&types], &[], false);
    let err = p.offerings("eu-central-1").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Throttled);
    assert_eq!(err.code(), "RequestLimitExceeded");
    assert_eq!(types.num_calls(), 3, "max_attempts, then give up");
}

#[test]
fn failed_node_group_carries_the_launch_failure_as_a_typed_error() {
    let ng = Nodegroup::builder()
        .nodegroup_name("ng")
        .status(NodegroupStatus::CreateFailed)
        .health(
            NodegroupHealth::builder()
                .issues(
                    Issue::builder()
                        .code(NodegroupIssueCode::AsgInstanceLaunchFailures)
                        .message("Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have sufficient p5.48xlarge capacity")
                        .build(),
                )
                .build(),
        )
        .build();
    let acq = super::nodegroups::to_acquisition("eu-central-1", &ng, Timestamp::now());
    assert_eq!(acq.state, crate::types::AcquisitionState::Failed);
    let failure = acq.failure.unwrap();
    assert_eq!((failure.kind(), failure.code()), (ErrorKind::InsufficientCapacity, "InsufficientInstanceCapacity"));
}

#[test]
fn capacity_block_past_its_end_is_interrupted() {
    let ng = Nodegroup::builder()
        .nodegroup_name("ng")
        .status(NodegroupStatus::Active)
        .tags("flotilla.dev/ends-at", "1800000000")
        .tags("flotilla.dev/capacity-type", "reserved")
        .build();
    let before = super::nodegroups::to_acquisition("r", &ng, Timestamp::from_second(1_799_999_999).unwrap());
    assert_eq!(before.state, crate::types::AcquisitionState::Active);
    let after = super::nodegroups::to_acquisition("r", &ng, Timestamp::from_second(1_800_000_000).unwrap());
    assert_eq!(after.state, crate::types::AcquisitionState::Interrupted);
    assert_eq!(after.events[0].kind, crate::types::CapacityEventKind::CapacityBlockEnd);
    assert_eq!(after.capacity_type, CapacityType::Reserved);
}
