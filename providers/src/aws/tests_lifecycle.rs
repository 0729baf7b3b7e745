//! The AWS adapter against `aws-smithy-mocks` for what follows an acquisition and moto cannot
//! show: a spot node group whose instances EC2 reclaimed (`describe` → `Interrupted` with a
//! `SpotInterruption` event), and `held_by` over several ListNodegroups pages, skipping other
//! claims' and deleting node groups, and a missing EKS cluster.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use aws_sdk_ec2::error::ErrorMetadata;
use aws_sdk_ec2::operation::describe_instances::DescribeInstancesOutput;
use aws_sdk_ec2::types::{Instance, InstanceState, InstanceStateName, Reservation, StateReason};
use aws_sdk_eks::operation::describe_nodegroup::DescribeNodegroupOutput;
use aws_sdk_eks::operation::list_nodegroups::{ListNodegroupsError, ListNodegroupsOutput};
use aws_sdk_eks::types::{CapacityTypes, Nodegroup, NodegroupScalingConfig, NodegroupStatus};
use aws_smithy_mocks::{Rule, RuleMode, mock};

use super::{AwsProvider, AwsTarget};
use crate::provider::CapacityProvider;
use crate::types::{AcquisitionState, CapacityEventKind};

fn target() -> AwsTarget {
    AwsTarget {
        cluster: "eu-fra-1".into(),
        eks_cluster: "inference-fra".into(),
        region: "eu-central-1".into(),
        jurisdiction: "EU".into(),
        subnets: BTreeMap::from([("eu-central-1a".to_string(), "subnet-a".to_string())]),
        node_role_arn: "arn:aws:iam::123456789012:role/nodes".into(),
        instance_types: vec!["p5.48xlarge".into()],
        reservations: false,
    }
}

fn provider(ec2_rules: &[&Rule], eks_rules: &[&Rule]) -> AwsProvider {
    let ec2 = mocked_client!(aws_sdk_ec2, RuleMode::MatchAny, ec2_rules);
    let eks = mocked_client!(aws_sdk_eks, RuleMode::MatchAny, eks_rules);
    let asg = mocked_client!(aws_sdk_autoscaling, RuleMode::MatchAny, &[] as &[&Rule]);
    AwsProvider::from_clients(target(), ec2, eks, asg)
}

fn nodegroup(name: &str, capacity: CapacityTypes, status: NodegroupStatus, claim: &str) -> Nodegroup {
    Nodegroup::builder()
        .nodegroup_name(name)
        .status(status)
        .capacity_type(capacity)
        .instance_types("p5.48xlarge")
        .scaling_config(NodegroupScalingConfig::builder().desired_size(2).max_size(2).min_size(0).build())
        .labels("flotilla.dev/claim", claim)
        .build()
}

fn describe_rule(ng: Nodegroup) -> Rule {
    let name = ng.nodegroup_name().unwrap_or_default().to_string();
    mock!(aws_sdk_eks::Client::describe_nodegroup)
        .match_requests(move |r| r.nodegroup_name() == Some(name.as_str()))
        .then_output(move || DescribeNodegroupOutput::builder().nodegroup(ng.clone()).build())
}

fn instance(id: &str, dns: &str, state: InstanceStateName, reason: &str) -> Instance {
    Instance::builder()
        .instance_id(id)
        .private_dns_name(dns)
        .state(InstanceState::builder().name(state).build())
        .state_reason(StateReason::builder().code(reason).message(reason).build())
        .build()
}

fn instances_rule(instances: Vec<Instance>) -> Rule {
    mock!(aws_sdk_ec2::Client::describe_instances)
        .match_requests(|r| {
            let filter = |name: &str| r.filters().iter().find(|f| f.name() == Some(name)).map(|f| f.values().to_vec());
            filter("tag:eks:nodegroup-name") == Some(vec!["ml-llama-spot".to_string()])
                && filter("tag:eks:cluster-name") == Some(vec!["inference-fra".to_string()])
        })
        .then_output(move || {
            DescribeInstancesOutput::builder()
                .reservations(Reservation::builder().set_instances(Some(instances.clone())).build())
                .build()
        })
}

#[tokio::test]
async fn a_reclaimed_spot_instance_interrupts_the_node_group() {
    let ng = describe_rule(nodegroup("ml-llama-spot", CapacityTypes::Spot, NodegroupStatus::Active, "ml.llama"));
    let ec2 = instances_rule(vec![
        instance("i-0a", "ip-10-0-1-10.eu-central-1.compute.internal", InstanceStateName::Running, "pending"),
        instance(
            "i-0b",
            "ip-10-0-1-11.eu-central-1.compute.internal",
            InstanceStateName::Terminated,
            "Server.SpotInstanceTermination",
        ),
    ]);
    let p = provider(&[&ec2], &[&ng]);
    let acq = p.describe("eu-central-1", "ml-llama-spot").await.unwrap();
    assert_eq!(acq.state, AcquisitionState::Interrupted, "{}", acq.message);
    assert_eq!(acq.events.len(), 1);
    assert_eq!(acq.events[0].kind, CapacityEventKind::SpotInterruption);
    assert_eq!(acq.events[0].nodes, ["ip-10-0-1-11.eu-central-1.compute.internal"], "only the reclaimed one");
    assert!(acq.message.starts_with("spot interruption: EC2 reclaimed 1 instance(s)"), "{}", acq.message);
    assert_eq!(ec2.num_calls(), 1, "filtered by the node group's EKS tags");
}

#[tokio::test]
async fn spot_instances_running_or_stopped_otherwise_are_not_an_interruption() {
    let ng = describe_rule(nodegroup("ml-llama-spot", CapacityTypes::Spot, NodegroupStatus::Active, "ml.llama"));
    let ec2 = instances_rule(vec![
        instance("i-0a", "ip-10-0-1-10", InstanceStateName::Running, "pending"),
        instance("i-0c", "ip-10-0-1-12", InstanceStateName::Terminated, "Client.UserInitiatedShutdown"),
    ]);
    let p = provider(&[&ec2], &[&ng]);
    let acq = p.describe("eu-central-1", "ml-llama-spot").await.unwrap();
    assert_eq!(acq.state, AcquisitionState::Active);
    assert!(acq.events.is_empty());
}

#[tokio::test]
async fn on_demand_node_groups_are_not_checked_for_spot_reclaims() {
    let ng = describe_rule(nodegroup("ml-llama-od", CapacityTypes::OnDemand, NodegroupStatus::Active, "ml.llama"));
    let ec2 = mock!(aws_sdk_ec2::Client::describe_instances).then_output(|| DescribeInstancesOutput::builder().build());
    let p = provider(&[&ec2], &[&ng]);
    let acq = p.describe("eu-central-1", "ml-llama-od").await.unwrap();
    assert_eq!(acq.state, AcquisitionState::Active);
    assert_eq!(ec2.num_calls(), 0, "no EC2 call for an on-demand node group");
}

#[tokio::test]
async fn held_by_reads_every_page_and_keeps_the_claims_live_node_groups() {
    let page1 = mock!(aws_sdk_eks::Client::list_nodegroups)
        .match_requests(|r| r.cluster_name() == Some("inference-fra") && r.next_token().is_none())
        .then_output(|| {
            ListNodegroupsOutput::builder().nodegroups("mine-a").nodegroups("theirs").next_token("p2").build()
        });
    let page2 = mock!(aws_sdk_eks::Client::list_nodegroups)
        .match_requests(|r| r.next_token() == Some("p2"))
        .then_output(|| ListNodegroupsOutput::builder().nodegroups("mine-b").nodegroups("mine-going").build());
    let rules = [
        page1,
        page2,
        describe_rule(nodegroup("mine-a", CapacityTypes::Spot, NodegroupStatus::Active, "ml.llama")),
        describe_rule(nodegroup("theirs", CapacityTypes::Spot, NodegroupStatus::Active, "ml.other")),
        describe_rule(nodegroup("mine-b", CapacityTypes::OnDemand, NodegroupStatus::Creating, "ml.llama")),
        describe_rule(nodegroup("mine-going", CapacityTypes::OnDemand, NodegroupStatus::Deleting, "ml.llama")),
    ];
    let p = provider(&[], &rules.iter().collect::<Vec<_>>());
    let held = p.held_by("ml.llama").await.unwrap();
    let region = "eu-central-1".to_string();
    assert_eq!(held, [(region.clone(), "mine-a".to_string()), (region, "mine-b".to_string())]);
}

#[tokio::test]
async fn held_by_a_missing_eks_cluster_is_nothing_and_other_errors_are_errors() {
    let missing = mock!(aws_sdk_eks::Client::list_nodegroups).then_error(|| {
        ListNodegroupsError::generic(
            ErrorMetadata::builder().code("ResourceNotFoundException").message("No cluster").build(),
        )
    });
    assert!(provider(&[], &[&missing]).held_by("ml.llama").await.unwrap().is_empty());
    let denied = mock!(aws_sdk_eks::Client::list_nodegroups).then_error(|| {
        ListNodegroupsError::generic(ErrorMetadata::builder().code("AccessDeniedException").message("no").build())
    });
    let err = provider(&[], &[&denied]).held_by("ml.llama").await.unwrap_err();
    assert_eq!((err.kind(), err.code()), (crate::error::ErrorKind::Unauthorized, "AccessDeniedException"));
}
