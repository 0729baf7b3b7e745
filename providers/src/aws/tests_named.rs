//! Removing the named nodes of an EKS node group, against `aws-smithy-mocks`: the claim
//! engine under `consolidation: WhenEmpty` terminates exactly the empty node's instance (with
//! the desired capacity decremented) and never a busy one, sends no size-only shrink
//! (`UpdateNodegroupConfig`) even when nodes it could not name are surplus too, refuses an
//! instance of another Auto Scaling group before terminating anything, and only when the claim
//! lets anything go shrinks the rest by size.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_autoscaling::operation::describe_auto_scaling_instances::DescribeAutoScalingInstancesOutput;
use aws_sdk_autoscaling::operation::terminate_instance_in_auto_scaling_group::TerminateInstanceInAutoScalingGroupOutput;
use aws_sdk_autoscaling::types::AutoScalingInstanceDetails;
use aws_sdk_eks::operation::describe_nodegroup::DescribeNodegroupOutput;
use aws_sdk_eks::operation::update_nodegroup_config::UpdateNodegroupConfigOutput;
use aws_sdk_eks::types::{
    AutoScalingGroup, CapacityTypes, Nodegroup, NodegroupResources, NodegroupScalingConfig, NodegroupStatus,
};
use aws_smithy_mocks::{Rule, RuleMode, mock};
use flotilla_apis::claim::{
    CapacityClaimSpec, CapacityClaimStatus, CapacityPolicy, ClaimAllocation, ClaimDeviceClass, Consolidation,
    DisruptionPolicy, PodSet, ScaleDown,
};
use flotilla_apis::class::{AwsProvisioning, InferenceClassSpec, Provisioning};
use flotilla_apis::common::{CapacityType, DeviceSpec};
use flotilla_apis::constants::{condition, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::AwsProvider;
use super::tests::target;
use crate::claim::{ClaimEngine, ClaimInput, ClaimUsage, NodeUse};
use crate::error::ErrorKind;
use crate::provider::CapacityProvider;
use crate::types::{NamedNode, NodeRemoval};

const GROUP: &str = "ml-llama-od";
const ASG: &str = "eks-ml-llama-od-4ec9";

fn provider(eks_rules: &[&Rule], asg_rules: &[&Rule]) -> AwsProvider {
    let ec2 = mocked_client!(aws_sdk_ec2, RuleMode::MatchAny, &[] as &[&Rule]);
    let eks = mocked_client!(aws_sdk_eks, RuleMode::MatchAny, eks_rules);
    let asg = mocked_client!(aws_sdk_autoscaling, RuleMode::MatchAny, asg_rules);
    AwsProvider::from_clients(target(false), ec2, eks, asg)
}

/// The on-demand node group with `desired` nodes, backed by Auto Scaling group `ASG`.
fn describe_rule(desired: i32) -> Rule {
    let ng = Nodegroup::builder()
        .nodegroup_name(GROUP)
        .status(NodegroupStatus::Active)
        .capacity_type(CapacityTypes::OnDemand)
        .instance_types("p5.48xlarge")
        .scaling_config(NodegroupScalingConfig::builder().desired_size(desired).max_size(desired).min_size(0).build())
        .resources(
            NodegroupResources::builder().auto_scaling_groups(AutoScalingGroup::builder().name(ASG).build()).build(),
        )
        .tags("flotilla.dev/class", "h100")
        .tags("flotilla.dev/capacity-type", "on-demand")
        .build();
    mock!(aws_sdk_eks::Client::describe_nodegroup)
        .match_requests(|r| r.nodegroup_name() == Some(GROUP))
        .then_output(move || DescribeNodegroupOutput::builder().nodegroup(ng.clone()).build())
}

/// Any UpdateNodegroupConfig: a size change, counted.
fn update_rule() -> Rule {
    mock!(aws_sdk_eks::Client::update_nodegroup_config).then_output(|| UpdateNodegroupConfigOutput::builder().build())
}

/// DescribeAutoScalingInstances answering each asked instance as in `group`.
fn instances_rule(group: &'static str) -> Rule {
    mock!(aws_sdk_autoscaling::Client::describe_auto_scaling_instances).then_compute_output(move |r| {
        let mut out = DescribeAutoScalingInstancesOutput::builder();
        for id in r.instance_ids() {
            out = out.auto_scaling_instances(
                AutoScalingInstanceDetails::builder()
                    .instance_id(id)
                    .auto_scaling_group_name(group)
                    .availability_zone("eu-central-1a")
                    .lifecycle_state("InService")
                    .health_status("HEALTHY")
                    .protected_from_scale_in(false)
                    .build(),
            );
        }
        out.build()
    })
}

/// TerminateInstanceInAutoScalingGroup of `instance` with the desired capacity decremented.
fn terminate_rule(instance: &'static str) -> Rule {
    mock!(aws_sdk_autoscaling::Client::terminate_instance_in_auto_scaling_group)
        .match_requests(move |r| {
            r.instance_id() == Some(instance) && r.should_decrement_desired_capacity() == Some(true)
        })
        .then_output(|| TerminateInstanceInAutoScalingGroupOutput::builder().build())
}

/// Any other termination (another instance, or without the decrement).
fn other_terminations() -> Rule {
    mock!(aws_sdk_autoscaling::Client::terminate_instance_in_auto_scaling_group)
        .then_output(|| TerminateInstanceInAutoScalingGroupOutput::builder().build())
}

fn node(name: &str, instance: &str, pods: u32) -> NodeUse {
    NodeUse {
        name: name.into(),
        acquisition: GROUP.into(),
        pods,
        provider_id: Some(format!("aws:///eu-central-1a/{instance}")),
    }
}

/// One step of a claim that held `held` nodes (one pod each) and now wants one pod, with the
/// nodes the member shows; returns the Surplus condition's reason and message.
async fn shrink(p: &AwsProvider, held: i32, nodes: Vec<NodeUse>, policy: DisruptionPolicy) -> (String, String) {
    let spec = CapacityClaimSpec {
        pod_sets: vec![PodSet { name: "decode".into(), count: 1, devices_per_pod: 8 }],
        latency: None,
        topology: None,
        capacity: CapacityPolicy {
            capacity_types: vec![CapacityType::OnDemand],
            device_classes: vec![ClaimDeviceClass { class: Some("h100".into()), selectors: Vec::new() }],
            sovereignty: None,
            reservation_ids: Vec::new(),
        },
        disruption: Some(policy),
    };
    let t0 = Timestamp::from_second(1_800_000_000).unwrap();
    let status = CapacityClaimStatus {
        allocations: vec![ClaimAllocation {
            pod_set: "decode".into(),
            cluster: "eu-fra-1".into(),
            pool: GROUP.into(),
            class: "h100".into(),
            capacity_type: Some(CapacityType::OnDemand),
            nodes: held,
            pods: held,
            since: Some(Time(t0)),
        }],
        ..Default::default()
    };
    let classes = BTreeMap::from([(
        "h100".to_string(),
        InferenceClassSpec {
            device: DeviceSpec { driver: "gpu.nvidia.com".into(), ..Default::default() },
            devices_per_node: 8,
            provisioning: Provisioning { aws: Some(AwsProvisioning { instance_types: vec!["p5.48xlarge".into()] }) },
            price_per_node_hour: Default::default(),
        },
    )]);
    let usage = ClaimUsage { clusters: BTreeSet::from(["eu-fra-1".to_string()]), nodes };
    let out = ClaimEngine::default()
        .step(
            ClaimInput {
                namespace: "ml",
                name: "llama",
                generation: Some(1),
                created: t0,
                spec: &spec,
                status: &status,
                classes: &classes,
                usage: &usage,
                now: Timestamp::from_second(1_800_003_600).unwrap(),
            },
            p,
        )
        .await;
    let c = out.status.conditions.get(condition::SURPLUS).unwrap().clone();
    (c.reason, c.message)
}

fn when_empty() -> DisruptionPolicy {
    DisruptionPolicy { min_lifetime: None, consolidation: Consolidation::WhenEmpty, scale_down: ScaleDown::Any }
}

#[tokio::test]
async fn when_empty_terminates_exactly_the_empty_nodes_instance_and_never_a_busy_one() {
    let (describe, update, instances) = (describe_rule(3), update_rule(), instances_rule(ASG));
    let (empty, other) = (terminate_rule("i-0e0"), other_terminations());
    let p = provider(&[&describe, &update], &[&instances, &empty, &other]);
    // Three nodes, one pod wanted: two surplus, but only one is empty.
    let nodes = vec![node("n-busy-1", "i-0b1", 1), node("n-empty", "i-0e0", 0), node("n-busy-2", "i-0b2", 1)];
    let (why, message) = shrink(&p, 3, nodes, when_empty()).await;
    assert_eq!(empty.num_calls(), 1, "the empty node's instance, with the desired capacity decremented");
    assert_eq!(other.num_calls(), 0, "no busy node's instance, no termination without the decrement");
    assert_eq!(update.num_calls(), 0, "no size-only shrink: EKS would pick the node");
    assert_eq!(instances.num_calls(), 1, "the instance was checked to be the node group's first");
    assert!(message.contains("removed 1 node(s) (n-empty)"), "{message}");
    assert!(message.contains("still run pods (n-busy-1 (1 pod(s)), n-busy-2 (1 pod(s)))"), "{message}");
    assert_eq!(why, reason::CONSOLIDATION_BLOCKED, "{message}");
}

#[tokio::test]
async fn nodes_not_joined_yet_are_kept_rather_than_shrunk_by_size() {
    let (describe, update, instances) = (describe_rule(3), update_rule(), instances_rule(ASG));
    let (empty, other) = (terminate_rule("i-0e0"), other_terminations());
    let p = provider(&[&describe, &update], &[&instances, &empty, &other]);
    // Three nodes held, two seen (one busy, one empty): the third has not joined. The engine
    // counts it as empty, but it has no name, so AWS may not be asked to pick it.
    let nodes = vec![node("n-busy-1", "i-0b1", 1), node("n-empty", "i-0e0", 0)];
    let (why, message) = shrink(&p, 3, nodes, when_empty()).await;
    assert_eq!((empty.num_calls(), other.num_calls(), update.num_calls()), (1, 0, 0));
    assert!(message.contains("removed 1 node(s) (n-empty)"), "{message}");
    assert!(message.contains("1 of the 2 surplus node(s)") && message.contains("not in eu-fra-1 yet"), "{message}");
    assert_eq!(why, reason::CONSOLIDATION_BLOCKED);
}

#[tokio::test]
async fn an_instance_of_another_group_is_refused_before_anything_is_terminated() {
    let (describe, update, instances) = (describe_rule(2), update_rule(), instances_rule("someone-elses-asg"));
    let other = other_terminations();
    let p = provider(&[&describe, &update], &[&instances, &other]);
    let removal = NodeRemoval {
        named: vec![NamedNode { name: "n-empty".into(), provider_id: Some("aws:///eu-central-1a/i-0e0".into()) }],
        nodes: 1,
        provider_may_choose: false,
    };
    let err = p.remove_nodes("eu-central-1", GROUP, &removal).await.unwrap_err();
    assert_eq!((err.kind(), err.code()), (ErrorKind::InvalidRequest, "NodeNotInNodeGroup"));
    assert!(err.to_string().contains("someone-elses-asg"), "{err}");
    assert_eq!((other.num_calls(), update.num_calls()), (0, 0), "nothing terminated, nothing resized");
    // A node without an EC2 instance in its providerID (kwok, another cloud) cannot be named.
    let unmapped = NodeRemoval {
        named: vec![NamedNode { name: "n-kwok".into(), provider_id: Some("kwok://n-kwok".into()) }],
        ..removal
    };
    let err = p.remove_nodes("eu-central-1", GROUP, &unmapped).await.unwrap_err();
    assert_eq!(err.code(), "NodeNotMapped");
    assert_eq!((other.num_calls(), update.num_calls()), (0, 0));
}

#[tokio::test]
async fn where_the_claim_lets_anything_go_the_unnamed_rest_shrinks_by_size() {
    let (describe, instances) = (describe_rule(3), instances_rule(ASG));
    let update = mock!(aws_sdk_eks::Client::update_nodegroup_config)
        .match_requests(|r| r.scaling_config().and_then(|s| s.desired_size()) == Some(1))
        .then_output(|| UpdateNodegroupConfigOutput::builder().build());
    let empty = terminate_rule("i-0e0");
    let p = provider(&[&describe, &update], &[&instances, &empty]);
    let removal = NodeRemoval {
        named: vec![NamedNode { name: "n-empty".into(), provider_id: Some("aws:///eu-central-1a/i-0e0".into()) }],
        nodes: 1,
        provider_may_choose: true,
    };
    let acq = p.remove_nodes("eu-central-1", GROUP, &removal).await.unwrap();
    assert_eq!(empty.num_calls(), 1, "the named empty node first");
    assert_eq!(update.num_calls(), 1, "then the rest by size, as the claim allows");
    assert_eq!(acq.nodes_granted, 1);
}
