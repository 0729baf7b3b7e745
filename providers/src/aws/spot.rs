//! Spot interruptions of an EKS node group: EC2 `DescribeInstances` filtered by the tags EKS
//! puts on a managed node group's instances (`eks:cluster-name`, `eks:nodegroup-name`), every
//! page; an instance whose state reason is `Server.SpotInstanceTermination` was reclaimed.
//! EC2 keeps terminated instances visible for about an hour, long enough for the claim engine
//! (which describes every allocation at least every resync) to see the reclaim, release the
//! node group and acquire anew. Any reclaimed instance interrupts the whole acquisition, as in
//! the simulated provider: the engine re-acquires rather than waiting on a replacement.

use aws_sdk_ec2::types::Filter;
use k8s_openapi::jiff::Timestamp;

use super::RegionClients;
use super::errors::from_sdk;
use crate::error::ProviderError;
use crate::types::{Acquisition, AcquisitionState, CapacityEvent, CapacityEventKind};

/// The state-reason code EC2 gives an instance it reclaimed.
pub(super) const SPOT_RECLAIMED: &str = "Server.SpotInstanceTermination";

/// Names (private DNS name, the EKS node name; else the instance id) of the node group's
/// instances EC2 reclaimed.
pub(super) async fn reclaimed(c: &RegionClients, nodegroup: &str) -> Result<Vec<String>, ProviderError> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = c
            .ec2
            .describe_instances()
            .filters(Filter::builder().name("tag:eks:cluster-name").values(&c.target.eks_cluster).build())
            .filters(Filter::builder().name("tag:eks:nodegroup-name").values(nodegroup).build())
            .set_next_token(token.clone())
            .send()
            .await
            .map_err(|e| from_sdk("DescribeInstances", &e))?;
        for instance in page.reservations().iter().flat_map(|r| r.instances()) {
            if instance.state_reason().and_then(|r| r.code()) != Some(SPOT_RECLAIMED) {
                continue;
            }
            let name = instance
                .private_dns_name()
                .filter(|n| !n.is_empty())
                .or(instance.instance_id())
                .unwrap_or_default()
                .to_string();
            out.push(name);
        }
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Marks `acquisition` interrupted by a spot reclaim of `nodes`, noticed at `now`.
pub(super) fn interrupt(acquisition: &mut Acquisition, nodes: Vec<String>, now: Timestamp) {
    acquisition.message = format!(
        "spot interruption: EC2 reclaimed {} instance(s) of node group {} ({})",
        nodes.len(),
        acquisition.id,
        nodes.join(", ")
    );
    acquisition.state = AcquisitionState::Interrupted;
    acquisition.events.push(CapacityEvent { kind: CapacityEventKind::SpotInterruption, at: now, nodes });
}
