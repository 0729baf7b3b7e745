//! Acquisition through EKS managed node groups. A request becomes one node group named after
//! the request (so a repeat finds it), in the subnets of the requested zones, with capacity
//! type `ON_DEMAND`, `SPOT` or `CAPACITY_BLOCK`, the request's labels and taints, and tags the
//! adapter reads back in `describe`. Reserved requests are checked against the named
//! capacity reservation first and target it through a launch template (which also carries a
//! cluster placement group when asked for). `describe` maps node group status and health to
//! an acquisition (a spot node group whose instances EC2 reclaimed is `Interrupted`, see
//! `spot`); `resize` updates its scaling config (growing, or shrinking where the claim lets EKS
//! pick the nodes); particular nodes are removed by `named.rs`; `release` deletes the node group.

use aws_sdk_ec2::types::{
    CapacityReservationTarget, CapacityReservationType, LaunchTemplateCapacityReservationSpecificationRequest,
    LaunchTemplateInstanceMarketOptionsRequest, LaunchTemplatePlacementRequest, MarketType, PlacementStrategy,
    RequestLaunchTemplateData,
};
use aws_sdk_eks::error::ProvideErrorMetadata;
use aws_sdk_eks::types::{
    CapacityTypes, LaunchTemplateSpecification, Nodegroup, NodegroupScalingConfig, NodegroupStatus, Taint,
    TaintEffect as EksTaintEffect,
};
use flotilla_apis::common::{CapacityType, TaintEffect};
use flotilla_apis::constants::labels::CLAIM as CLAIM_LABEL;
use k8s_openapi::jiff::Timestamp;

use super::RegionClients;
use super::errors::{from_code, from_sdk};
use crate::error::{ErrorKind, ProviderError};
use crate::types::{AcquireRequest, Acquisition, AcquisitionState, CapacityEvent, CapacityEventKind};

const TAG_ZONE: &str = "flotilla.dev/zone";
const TAG_CLASS: &str = "flotilla.dev/class";
const TAG_CAPACITY_TYPE: &str = "flotilla.dev/capacity-type";
const TAG_ENDS_AT: &str = "flotilla.dev/ends-at";
const TAG_RESERVATION: &str = "flotilla.dev/reservation";

fn mismatch(code: &str, message: String) -> ProviderError {
    ProviderError::new(ErrorKind::ReservationMismatch, code, message)
}

/// Checks the reservation fits; returns whether it is a capacity block and when it ends.
async fn check_reservation(
    c: &RegionClients,
    request: &AcquireRequest,
    id: &str,
) -> Result<(bool, Option<i64>), ProviderError> {
    let out = c
        .ec2
        .describe_capacity_reservations()
        .capacity_reservation_ids(id)
        .send()
        .await
        .map_err(|e| from_sdk("DescribeCapacityReservations", &e))?;
    let Some(r) = out.capacity_reservations().first() else {
        return Err(mismatch("InvalidCapacityReservationId.NotFound", format!("reservation {id} does not exist")));
    };
    let ty = r.instance_type().unwrap_or_default();
    if !request.instance_types.iter().any(|t| t == ty) {
        return Err(mismatch(
            "ReservationMismatch",
            format!("reservation {id} is for {ty}, not {}", request.instance_types.join(", ")),
        ));
    }
    let zone = r.availability_zone().unwrap_or_default();
    if !request.zones.is_empty() && !request.zones.iter().any(|z| z == zone) {
        return Err(mismatch(
            "ReservationMismatch",
            format!("reservation {id} is in {zone}, not {}", request.zones.join(", ")),
        ));
    }
    let state = r.state().map(|s| s.as_str()).unwrap_or("unknown");
    if state != "active" {
        return Err(mismatch("ReservationMismatch", format!("reservation {id} is {state}, not active")));
    }
    let free = u32::try_from(r.available_instance_count().unwrap_or(0)).unwrap_or(0);
    if free < request.min_nodes.max(1) {
        return Err(mismatch(
            "ReservationCapacityExceeded",
            format!("reservation {id} has {free} free instance(s), {} needed", request.min_nodes.max(1)),
        ));
    }
    let block = r.reservation_type() == Some(&CapacityReservationType::CapacityBlock);
    Ok((block, r.end_date().map(|d| d.secs())))
}

async fn launch_template(c: &RegionClients, request: &AcquireRequest, block: bool) -> Result<(), ProviderError> {
    let mut data = RequestLaunchTemplateData::builder();
    if let Some(id) = &request.reservation_id {
        data = data.capacity_reservation_specification(
            LaunchTemplateCapacityReservationSpecificationRequest::builder()
                .capacity_reservation_target(CapacityReservationTarget::builder().capacity_reservation_id(id).build())
                .build(),
        );
    }
    if block {
        data = data.instance_market_options(
            LaunchTemplateInstanceMarketOptionsRequest::builder().market_type(MarketType::CapacityBlock).build(),
        );
    }
    if request.placement_group {
        let created =
            c.ec2.create_placement_group().group_name(&request.name).strategy(PlacementStrategy::Cluster).send().await;
        if let Err(e) = created
            && e.code() != Some("InvalidPlacementGroup.Duplicate")
        {
            return Err(from_sdk("CreatePlacementGroup", &e));
        }
        data = data.placement(LaunchTemplatePlacementRequest::builder().group_name(&request.name).build());
    }
    let created = c
        .ec2
        .create_launch_template()
        .launch_template_name(&request.name)
        .launch_template_data(data.build())
        .send()
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some("InvalidLaunchTemplateName.AlreadyExistsException") => Ok(()),
        Err(e) => Err(from_sdk("CreateLaunchTemplate", &e)),
    }
}

pub(super) async fn acquire(c: &RegionClients, request: &AcquireRequest) -> Result<Acquisition, ProviderError> {
    let subnets: Vec<String> = c
        .target
        .subnets
        .iter()
        .filter(|(zone, _)| request.zones.is_empty() || request.zones.contains(zone))
        .map(|(_, subnet)| subnet.clone())
        .collect();
    if subnets.is_empty() {
        return Err(ProviderError::new(
            ErrorKind::InvalidRequest,
            "NoSubnet",
            format!("no subnet configured for {} in {}", request.zones.join(", "), c.target.region),
        ));
    }
    let (mut block, mut ends_at) = (false, None);
    if request.capacity_type == CapacityType::Reserved {
        let Some(id) = &request.reservation_id else {
            return Err(mismatch("MissingReservation", "reserved capacity needs a reservation id".to_string()));
        };
        (block, ends_at) = check_reservation(c, request, id).await?;
    }
    let templated = request.reservation_id.is_some() || request.placement_group;
    if templated {
        launch_template(c, request, block).await?;
    }
    let capacity_type = match request.capacity_type {
        CapacityType::Spot => CapacityTypes::Spot,
        CapacityType::Reserved if block => CapacityTypes::CapacityBlock,
        CapacityType::Reserved | CapacityType::OnDemand => CapacityTypes::OnDemand,
    };
    let nodes = i32::try_from(request.nodes).unwrap_or(i32::MAX);
    let mut call = c
        .eks
        .create_nodegroup()
        .cluster_name(&c.target.eks_cluster)
        .nodegroup_name(&request.name)
        .node_role(&c.target.node_role_arn)
        .set_subnets(Some(subnets))
        .set_instance_types(Some(request.instance_types.clone()))
        .capacity_type(capacity_type)
        .scaling_config(
            NodegroupScalingConfig::builder().min_size(0).max_size(nodes.max(1)).desired_size(nodes).build(),
        )
        .client_request_token(&request.name)
        .tags(TAG_CLASS, &request.class)
        .tags(TAG_CAPACITY_TYPE, request.capacity_type.as_str())
        .tags(TAG_ZONE, request.zones.first().cloned().unwrap_or_default());
    if let Some(id) = &request.reservation_id {
        call = call.tags(TAG_RESERVATION, id);
    }
    if let Some(end) = ends_at {
        call = call.tags(TAG_ENDS_AT, end.to_string());
    }
    if templated {
        call =
            call.launch_template(LaunchTemplateSpecification::builder().name(&request.name).version("$Latest").build());
    }
    for (k, v) in &request.labels {
        call = call.labels(k, v);
    }
    for t in &request.taints {
        let effect = match t.effect {
            TaintEffect::NoSchedule => EksTaintEffect::NoSchedule,
            TaintEffect::PreferNoSchedule => EksTaintEffect::PreferNoSchedule,
            TaintEffect::NoExecute => EksTaintEffect::NoExecute,
        };
        call = call.taints(Taint::builder().key(&t.key).value(&t.value).effect(effect).build());
    }
    match call.send().await {
        Ok(out) => match out.nodegroup() {
            Some(ng) => Ok(to_acquisition(&c.target.region, ng, Timestamp::now())),
            None => describe(c, &request.name).await,
        },
        Err(e) if e.code() == Some("ResourceInUseException") => describe(c, &request.name).await,
        Err(e) => Err(from_sdk("CreateNodegroup", &e)),
    }
}

/// The node group `id` as EKS describes it.
pub(super) async fn nodegroup(c: &RegionClients, id: &str) -> Result<Nodegroup, ProviderError> {
    let out = c
        .eks
        .describe_nodegroup()
        .cluster_name(&c.target.eks_cluster)
        .nodegroup_name(id)
        .send()
        .await
        .map_err(|e| from_sdk("DescribeNodegroup", &e))?;
    out.nodegroup().cloned().ok_or_else(|| {
        ProviderError::new(ErrorKind::InvalidRequest, "ResourceNotFoundException", format!("no node group {id}"))
    })
}

pub(super) async fn describe(c: &RegionClients, id: &str) -> Result<Acquisition, ProviderError> {
    let ng = nodegroup(c, id).await?;
    let now = Timestamp::now();
    let mut acquisition = to_acquisition(&c.target.region, &ng, now);
    let live = matches!(acquisition.state, AcquisitionState::Active | AcquisitionState::Provisioning);
    if live && acquisition.capacity_type == CapacityType::Spot {
        let lost = super::spot::reclaimed(c, id).await?;
        if !lost.is_empty() {
            super::spot::interrupt(&mut acquisition, lost, now);
        }
    }
    Ok(acquisition)
}

pub(super) async fn resize(c: &RegionClients, id: &str, nodes: u32) -> Result<Acquisition, ProviderError> {
    let nodes = i32::try_from(nodes).unwrap_or(i32::MAX);
    c.eks
        .update_nodegroup_config()
        .cluster_name(&c.target.eks_cluster)
        .nodegroup_name(id)
        .scaling_config(
            NodegroupScalingConfig::builder().min_size(0).max_size(nodes.max(1)).desired_size(nodes).build(),
        )
        .send()
        .await
        .map_err(|e| from_sdk("UpdateNodegroupConfig", &e))?;
    describe(c, id).await
}

pub(super) async fn release(c: &RegionClients, id: &str) -> Result<(), ProviderError> {
    let deleted = c.eks.delete_nodegroup().cluster_name(&c.target.eks_cluster).nodegroup_name(id).send().await;
    match deleted {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some("ResourceNotFoundException") => Ok(()),
        Err(e) => Err(from_sdk("DeleteNodegroup", &e)),
    }
}

/// Node groups of the EKS cluster labelled `flotilla.dev/claim=<claim>` (the request's labels
/// become the node group's), except those already being deleted: ListNodegroups, every
/// page, then DescribeNodegroup of each (a group deleted in between is skipped). A missing
/// EKS cluster holds nothing.
pub(super) async fn held_by(c: &RegionClients, claim: &str) -> Result<Vec<String>, ProviderError> {
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = match c
            .eks
            .list_nodegroups()
            .cluster_name(&c.target.eks_cluster)
            .set_next_token(token.clone())
            .send()
            .await
        {
            Ok(page) => page,
            // No EKS cluster, no node group of it.
            Err(e) if e.code() == Some("ResourceNotFoundException") => return Ok(Vec::new()),
            Err(e) => return Err(from_sdk("ListNodegroups", &e)),
        };
        names.extend(page.nodegroups().iter().cloned());
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    let mut held = Vec::new();
    for name in names {
        let out = c.eks.describe_nodegroup().cluster_name(&c.target.eks_cluster).nodegroup_name(&name).send().await;
        let ng = match out {
            Ok(out) => out.nodegroup().cloned(),
            Err(e) if e.code() == Some("ResourceNotFoundException") => None,
            Err(e) => return Err(from_sdk("DescribeNodegroup", &e)),
        };
        let Some(ng) = ng else { continue };
        let labelled = ng.labels().and_then(|l| l.get(CLAIM_LABEL)).is_some_and(|v| v == claim);
        if labelled && ng.status() != Some(&NodegroupStatus::Deleting) {
            held.push(name);
        }
    }
    Ok(held)
}

/// A node group as an acquisition, at `now` (a capacity block past its end is interrupted).
pub(super) fn to_acquisition(region: &str, ng: &Nodegroup, now: Timestamp) -> Acquisition {
    let tag = |k: &str| ng.tags().and_then(|t| t.get(k)).cloned();
    let capacity_type = match tag(TAG_CAPACITY_TYPE).as_deref() {
        Some("reserved") => CapacityType::Reserved,
        Some("spot") => CapacityType::Spot,
        Some("on-demand") => CapacityType::OnDemand,
        _ => match ng.capacity_type() {
            Some(CapacityTypes::Spot) => CapacityType::Spot,
            Some(CapacityTypes::CapacityBlock) => CapacityType::Reserved,
            _ => CapacityType::OnDemand,
        },
    };
    let granted = ng.scaling_config().and_then(|s| s.desired_size()).and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    let issues: Vec<(String, String)> = ng
        .health()
        .map(|h| {
            h.issues()
                .iter()
                .map(|i| {
                    (
                        i.code().map(|c| c.as_str().to_string()).unwrap_or_default(),
                        i.message().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let ended = tag(TAG_ENDS_AT).and_then(|s| s.parse::<i64>().ok()).and_then(|s| Timestamp::from_second(s).ok());
    let status = ng.status().cloned().unwrap_or(NodegroupStatus::Creating);
    let (state, failure) = match status {
        _ if ended.is_some_and(|at| at <= now) => (AcquisitionState::Interrupted, None),
        NodegroupStatus::Active => (AcquisitionState::Active, None),
        NodegroupStatus::Creating | NodegroupStatus::Updating => (AcquisitionState::Provisioning, None),
        NodegroupStatus::Deleting => (AcquisitionState::Released, None),
        _ => {
            let (code, message) =
                issues.first().cloned().unwrap_or_else(|| (status.as_str().to_string(), String::new()));
            // Launch failures carry the EC2 code in the message.
            let code = ["InsufficientInstanceCapacity", "VcpuLimitExceeded", "InstanceLimitExceeded"]
                .into_iter()
                .find(|c| message.contains(c))
                .map_or(code, str::to_string);
            (AcquisitionState::Failed, Some(from_code(&code, &message)))
        }
    };
    let events = match (state, ended) {
        (AcquisitionState::Interrupted, Some(at)) => {
            vec![CapacityEvent { kind: CapacityEventKind::CapacityBlockEnd, at, nodes: Vec::new() }]
        }
        _ => Vec::new(),
    };
    let message = match (&failure, state) {
        (Some(f), _) => f.to_string(),
        (None, AcquisitionState::Interrupted) => format!("capacity block end: node group {status:?} past its end"),
        _ => format!("node group {} with {granted} desired node(s)", status.as_str()),
    };
    Acquisition {
        id: ng.nodegroup_name().unwrap_or_default().to_string(),
        region: region.to_string(),
        zone: tag(TAG_ZONE).filter(|z| !z.is_empty()),
        instance_type: ng.instance_types().first().cloned().unwrap_or_default(),
        capacity_type,
        class: tag(TAG_CLASS).unwrap_or_default(),
        nodes_granted: granted,
        state,
        // EKS nodes register with the member cluster themselves: nothing to materialise.
        nodes: Vec::new(),
        events,
        message,
        failure,
    }
}
