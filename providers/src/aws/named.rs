//! Removing particular nodes from an EKS managed node group, so a claim's disruption intent
//! holds: shrinking the node group's desired size lets EKS (its Auto Scaling group) pick which
//! instance goes, which may be a busy one. In: the empty nodes the claim named, each with its
//! Kubernetes `spec.providerID` (`aws:///<zone>/<instance id>`). Each instance is first checked
//! to belong to one of the node group's Auto Scaling groups (`DescribeAutoScalingInstances`;
//! nothing is terminated when one does not), then terminated with
//! `TerminateInstanceInAutoScalingGroup` and `ShouldDecrementDesiredCapacity=true`, as
//! cluster-autoscaler removes a node of a managed node group: the group's desired capacity
//! drops by one per instance and nothing replaces it. The node group's `desiredSize` follows
//! its Auto Scaling group's; no `UpdateNodegroupConfig` is sent then (its `desiredSize` would be
//! the size-only shrink this avoids, racing EKS's read-back). Only when the claim lets the
//! provider pick (`provider_may_choose`) does a remainder the claim could not name shrink by
//! size. Out: the acquisition with what it holds afterwards.

use aws_sdk_ec2::error::ProvideErrorMetadata;

use super::RegionClients;
use super::errors::from_sdk;
use super::nodegroups;
use crate::error::{ErrorKind, ProviderError};
use crate::types::{Acquisition, NodeRemoval};

/// The EC2 instance id in a node's `spec.providerID` (`aws:///eu-central-1a/i-0abc` → `i-0abc`).
pub fn instance_id(provider_id: &str) -> Option<&str> {
    let rest = provider_id.strip_prefix("aws://")?;
    let id = rest.rsplit('/').next()?;
    let hex = id.strip_prefix("i-")?;
    (!hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit())).then_some(id)
}

fn refuse(code: &str, message: String) -> ProviderError {
    ProviderError::new(ErrorKind::InvalidRequest, code, message)
}

/// Shrinks node group `id` as `removal` says (see the module header).
pub(super) async fn remove_nodes(
    c: &RegionClients,
    id: &str,
    removal: &NodeRemoval,
) -> Result<Acquisition, ProviderError> {
    let ng = nodegroups::nodegroup(c, id).await?;
    let before = ng.scaling_config().and_then(|s| s.desired_size()).and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    if removal.nodes >= before {
        // Nothing to take away (a grow goes through resize).
        return if removal.nodes > before {
            nodegroups::resize(c, id, removal.nodes).await
        } else {
            nodegroups::describe(c, id).await
        };
    }
    let reduction = usize::try_from(before - removal.nodes).unwrap_or(usize::MAX);
    // The instances behind the named nodes, at most the reduction.
    let mut instances: Vec<(String, String)> = Vec::new();
    for node in &removal.named {
        match node.provider_id.as_deref().and_then(instance_id) {
            Some(i) => instances.push((node.name.clone(), i.to_string())),
            // Free to pick: a node that cannot be named is left to the size shrink below.
            None if removal.provider_may_choose => {}
            None => {
                return Err(refuse(
                    "NodeNotMapped",
                    format!(
                        "node {} of node group {id} has no EC2 instance in its spec.providerID ({}); it is removed \
                         once its kubelet reports one (aws:///<zone>/i-...)",
                        node.name,
                        node.provider_id.as_deref().unwrap_or("none")
                    ),
                ));
            }
        }
    }
    instances.truncate(reduction);
    let groups: Vec<&str> =
        ng.resources().map(|r| r.auto_scaling_groups().iter().filter_map(|g| g.name()).collect()).unwrap_or_default();
    let mut terminated = 0u32;
    if !instances.is_empty() {
        let ids: Vec<String> = instances.iter().map(|(_, i)| i.clone()).collect();
        let out = c
            .asg
            .describe_auto_scaling_instances()
            .set_instance_ids(Some(ids))
            .send()
            .await
            .map_err(|e| from_sdk("DescribeAutoScalingInstances", &e))?;
        let known = out.auto_scaling_instances();
        // Every instance is checked before any is terminated.
        let mut doomed = Vec::new();
        for (node, instance) in &instances {
            let Some(details) = known.iter().find(|d| d.instance_id() == Some(instance.as_str())) else {
                // Already gone from its group: nothing to terminate.
                continue;
            };
            let group = details.auto_scaling_group_name().unwrap_or_default();
            if !groups.contains(&group) {
                return Err(refuse(
                    "NodeNotInNodeGroup",
                    format!(
                        "node {node} (instance {instance}) is in Auto Scaling group {group}, not in node group {id}'s \
                         ({}); nothing was terminated: check the node's flotilla.dev/acquisition label",
                        groups.join(", ")
                    ),
                ));
            }
            if details.lifecycle_state().is_some_and(|s| s.starts_with("Terminating")) {
                continue;
            }
            doomed.push(instance.as_str());
        }
        for instance in doomed {
            let answer = c
                .asg
                .terminate_instance_in_auto_scaling_group()
                .instance_id(instance)
                .should_decrement_desired_capacity(true)
                .send()
                .await;
            match answer {
                Ok(_) => terminated += 1,
                // Terminated meanwhile (by EC2 or someone else): not ours to count.
                Err(e)
                    if e.code() == Some("ValidationError") && e.message().is_some_and(|m| m.contains("not found")) => {}
                Err(e) => return Err(from_sdk("TerminateInstanceInAutoScalingGroup", &e)),
            }
        }
    }
    let remaining = before - terminated.min(before);
    if removal.provider_may_choose && remaining > removal.nodes {
        // The claim lets anything go: the rest by size.
        let mut acq = nodegroups::resize(c, id, removal.nodes).await?;
        acq.nodes_granted = removal.nodes;
        return Ok(acq);
    }
    let mut acq = nodegroups::describe(c, id).await?;
    // EKS reads the Auto Scaling group's decremented capacity back with a delay.
    acq.nodes_granted = remaining;
    Ok(acq)
}

#[cfg(test)]
mod tests {
    use super::instance_id;

    #[test]
    fn instance_ids_come_from_aws_provider_ids_only() {
        assert_eq!(instance_id("aws:///eu-central-1a/i-0123456789abcdef0"), Some("i-0123456789abcdef0"));
        assert_eq!(instance_id("aws:///i-0abc"), Some("i-0abc"));
        assert_eq!(instance_id("gce://project/zone/instance-1"), None);
        assert_eq!(instance_id("aws:///eu-central-1a/"), None);
        assert_eq!(instance_id("aws:///eu-central-1a/i-"), None);
        assert_eq!(instance_id("aws:///eu-central-1a/i-0xyz"), None, "not hex");
        assert_eq!(instance_id("kwok://node-1"), None);
    }
}
