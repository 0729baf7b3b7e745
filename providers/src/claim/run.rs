//! One step of the claim engine, in order: check what earlier steps obtained (describe;
//! release what was interrupted or is outside the allowed regions), decide whether the claim
//! has expired, then search capacity types × device alternatives × allowed regions for what
//! is missing, one provider attempt per offering, cheapest first, skipping offerings that are
//! cooling down. The outcome goes to `report` for conditions and messages.

use std::collections::BTreeSet;

use flotilla_apis::claim::{ClaimAllocation, ClaimAttempt, PlacementGroupMode, PodSet};
use flotilla_apis::common::{CapacityType, TaintEffect};
use flotilla_apis::constants::{condition, labels};
use flotilla_apis::fnv::fnv1a64;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::memory::{NO_OFFERING, OfferingKey, cooling, cooling_until, transient_backoff};
use super::report::{self, Outcome};
use super::search::{Alternative, candidates};
use super::{ClaimEngine, ClaimInput, ClaimStep, duration};
use crate::clock::{add, elapsed};
use crate::error::{ErrorKind, ProviderError};
use crate::provider::CapacityProvider;
use crate::types::{AcquireRequest, Acquisition, AcquisitionState, NodeTaint, Offering, RegionInfo};

/// Mutable state of one step.
pub(super) struct Run {
    pub attempts: Vec<ClaimAttempt>,
    pub allocations: Vec<ClaimAllocation>,
    pub acquisitions: Vec<Acquisition>,
    pub provider: String,
    pub providers: Vec<(String, String)>,
    pub now: Timestamp,
    pub new_attempts: usize,
    pub zone: Option<String>,
    pub provisioning: bool,
    pub interrupted: Vec<String>,
    pub released: Vec<String>,
    pub transient: Option<ProviderError>,
    pub fatal: Option<ProviderError>,
    /// Surplus held back or being given back (`disrupt`).
    pub surplus: Vec<super::disrupt::Held>,
    /// When a `minLifetime` hold lifts.
    pub wake: Option<Timestamp>,
    /// Surplus waits on pods leaving nodes (or was just given back): look again soon.
    pub recheck: bool,
}

impl Run {
    fn attempt(&mut self, region: &str, class: &str, ct: CapacityType, result: &str, message: String) {
        self.attempts.push(ClaimAttempt {
            time: Some(Time(self.now)),
            provider: self
                .providers
                .iter()
                .find(|(r, _)| r == region)
                .map_or_else(|| self.provider.clone(), |(_, p)| p.clone()),
            region: region.to_string(),
            class: class.to_string(),
            capacity_type: Some(ct),
            result: result.to_string(),
            message,
        });
        self.new_attempts += 1;
    }

    pub fn pods(&self, pod_set: &str) -> i32 {
        self.allocations.iter().filter(|a| a.pod_set == pod_set).map(|a| a.pods).sum()
    }
}

pub(super) async fn step(engine: &ClaimEngine, input: ClaimInput<'_>, provider: &dyn CapacityProvider) -> ClaimStep {
    let settings = &engine.settings;
    let prev = input.status;
    let regions = provider.regions();
    let sovereignty = input.spec.capacity.sovereignty.clone().unwrap_or_default();
    let allowed: Vec<&RegionInfo> = regions.iter().filter(|r| sovereignty.allows(&r.jurisdiction, &r.name)).collect();
    let mut run = Run {
        attempts: prev.attempts.clone(),
        allocations: Vec::new(),
        acquisitions: Vec::new(),
        provider: provider.name().to_string(),
        providers: regions.iter().map(|r| (r.name.clone(), r.provider.clone())).collect(),
        now: input.now,
        new_attempts: 0,
        zone: None,
        provisioning: false,
        interrupted: Vec::new(),
        released: Vec::new(),
        transient: None,
        fatal: None,
        surplus: Vec::new(),
        wake: None,
        recheck: false,
    };

    let alternatives = match super::search::alternatives(input.spec, input.classes, &engine.selectors) {
        Ok(alts) => alts,
        Err(message) => {
            run.allocations = prev.allocations.clone();
            return report::finish(engine, &input, run, Outcome::Invalid(message), settings.resync);
        }
    };

    check_existing(&input, provider, &regions, &allowed, &mut run).await;
    if allowed.is_empty() {
        let offered = regions.iter().map(|r| format!("{} ({})", r.name, r.jurisdiction)).collect::<Vec<_>>().join(", ");
        return report::finish(engine, &input, run, Outcome::NoAllowedRegion(offered), settings.resync);
    }
    if !run.interrupted.is_empty() {
        return report::finish(engine, &input, run, Outcome::Interrupted, settings.reacquire_after);
    }
    if run.transient.is_none() {
        super::disrupt::scale_down(&input, provider, &regions, &mut run).await;
    }

    let missing = |run: &Run| input.spec.pod_sets.iter().any(|p| run.pods(&p.name) < p.count);
    let latency =
        input.spec.latency.as_ref().and_then(|l| l.max_provisioning_latency.as_deref()).and_then(duration::parse);
    let since = prev
        .conditions
        .get(condition::FULFILLED)
        .filter(|c| c.status == "False")
        .map_or(input.created, |c| c.last_transition_time.0.max(input.created));
    if let Some(latency) = latency.filter(|l| missing(&run) && input.now >= add(since, *l)) {
        return report::finish(engine, &input, run, Outcome::Expired { latency, since }, settings.resync);
    }

    if run.transient.is_none() && missing(&run) {
        search(engine, &input, provider, &allowed, &alternatives, &mut run).await;
    }

    let (outcome, requeue) = if let Some(e) = run.transient.clone() {
        let backoff = transient_backoff(&run.attempts, settings.transient_cap).unwrap_or(settings.provisioning_poll);
        (Outcome::Transient(e), backoff)
    } else if let Some(e) = run.fatal.clone() {
        (Outcome::Fatal(e), settings.resync)
    } else if missing(&run) {
        let next = cooling(&run.attempts, input.now, settings.unavailable_for, settings.unavailable_cap)
            .iter()
            .map(|(_, until, _)| *until)
            .min();
        let wait = next.map_or(settings.unavailable_for, |t| elapsed(input.now, t)).min(settings.unavailable_for);
        let wait = if run.provisioning { wait.min(settings.provisioning_poll) } else { wait };
        (Outcome::Short, wait.max(std::time::Duration::from_secs(1)))
    } else if run.provisioning {
        (Outcome::Provisioning, settings.provisioning_poll)
    } else {
        (Outcome::Fulfilled, settings.resync)
    };
    // Surplus kept for drain or emptiness is looked at again soon; a minLifetime hold when it lifts.
    let mut requeue = requeue;
    if run.recheck {
        requeue = requeue.min(settings.provisioning_poll);
    }
    if let Some(wake) = run.wake {
        requeue = requeue.min(elapsed(input.now, wake).max(std::time::Duration::from_secs(1)));
    }
    report::finish(engine, &input, run, outcome, requeue)
}

/// Describes every earlier allocation; keeps what still holds nodes, releases what was
/// interrupted or now lies outside the allowed regions.
async fn check_existing(
    input: &ClaimInput<'_>,
    provider: &dyn CapacityProvider,
    regions: &[RegionInfo],
    allowed: &[&RegionInfo],
    run: &mut Run,
) {
    for alloc in &input.status.allocations {
        let Some(region) = regions.iter().find(|r| r.cluster == alloc.cluster) else {
            // Not this provider's: keep it untouched.
            run.allocations.push(alloc.clone());
            continue;
        };
        let ct = alloc.capacity_type.unwrap_or(CapacityType::OnDemand);
        if !allowed.iter().any(|a| a.name == region.name) {
            match provider.release(&region.name, &alloc.pool).await {
                Ok(()) => run.released.push(format!(
                    "{} in {}: region no longer allowed by spec.capacity.sovereignty",
                    alloc.pool, region.name
                )),
                Err(e) => {
                    run.allocations.push(alloc.clone());
                    run.transient.get_or_insert(e);
                }
            }
            continue;
        }
        match provider.describe(&region.name, &alloc.pool).await {
            Ok(acq) if acq.state == AcquisitionState::Interrupted => {
                let what = format!(
                    "{} ({} {} {} node(s) in {})",
                    acq.message,
                    ct,
                    alloc.class,
                    acq.nodes_granted,
                    acq.zone.as_deref().unwrap_or(&region.name)
                );
                if let Err(e) = provider.release(&region.name, &alloc.pool).await {
                    run.transient.get_or_insert(e);
                }
                run.attempt(&region.name, &alloc.class, ct, "Interrupted", format!("{}: {}", alloc.pool, acq.message));
                run.interrupted.push(what);
            }
            Ok(acq) if acq.state == AcquisitionState::Failed => {
                // The provider accepted the request but could not bring the nodes up (EKS
                // node group CREATE_FAILED): give it back and remember the offering.
                if let Err(e) = provider.release(&region.name, &alloc.pool).await {
                    run.transient.get_or_insert(e);
                }
                let result = acq.failure.as_ref().map_or(ErrorKind::InsufficientCapacity, ProviderError::kind);
                run.attempt(
                    &region.name,
                    &alloc.class,
                    ct,
                    result.as_str(),
                    format!("{}: {}", alloc.pool, acq.message),
                );
                run.released.push(format!("{} in {}: {}", alloc.pool, region.name, acq.message));
            }
            Ok(acq) if acq.state == AcquisitionState::Released => {
                run.released.push(format!("{} in {}: {}", alloc.pool, region.name, acq.message));
            }
            Ok(acq) => {
                if acq.state == AcquisitionState::Provisioning {
                    run.provisioning = true;
                }
                if run.zone.is_none() {
                    run.zone = acq.zone.clone();
                }
                run.allocations.push(ClaimAllocation {
                    nodes: acq.nodes_granted as i32,
                    since: alloc.since.clone().or(Some(Time(input.now))),
                    ..alloc.clone()
                });
                run.acquisitions.push(acq);
            }
            Err(e) if e.kind().is_transient() => {
                run.allocations.push(alloc.clone());
                run.transient.get_or_insert(e);
            }
            Err(e) => run.released.push(format!("{} in {}: {e}", alloc.pool, region.name)),
        }
    }
}

async fn search(
    engine: &ClaimEngine,
    input: &ClaimInput<'_>,
    provider: &dyn CapacityProvider,
    allowed: &[&RegionInfo],
    alternatives: &[Alternative<'_>],
    run: &mut Run,
) {
    let settings = &engine.settings;
    let same_zone = input.spec.topology.as_ref().is_some_and(|t| t.same_zone);
    // A region is searched once, however many clusters it holds (a static site lists each of
    // its clusters): its offerings name the cluster they belong to.
    let mut seen: Vec<&str> = Vec::new();
    let allowed: Vec<&RegionInfo> = allowed
        .iter()
        .copied()
        .filter(|r| {
            let first = !seen.contains(&r.name.as_str());
            seen.push(&r.name);
            first
        })
        .collect();
    let mut offerings: Vec<(String, Vec<Offering>)> = Vec::new();
    let mut quota_blocked: BTreeSet<(String, CapacityType)> = BTreeSet::new();
    let mut capacity_types: Vec<CapacityType> = Vec::new();
    for ct in &input.spec.capacity.capacity_types {
        if !capacity_types.contains(ct) {
            capacity_types.push(*ct);
        }
    }
    'pod_sets: for pod_set in &input.spec.pod_sets {
        for &ct in &capacity_types {
            for alt in alternatives {
                for region in &allowed {
                    let mut missing = pod_set.count - run.pods(&pod_set.name);
                    if missing <= 0 {
                        continue 'pod_sets;
                    }
                    if quota_blocked.contains(&(region.name.clone(), ct)) {
                        continue;
                    }
                    let key = OfferingKey { region: region.name.clone(), class: alt.label.clone(), capacity_type: ct };
                    if cooling_until(&run.attempts, &key, settings.unavailable_for, settings.unavailable_cap)
                        .is_some_and(|until| until > run.now)
                    {
                        continue;
                    }
                    if !offerings.iter().any(|(r, _)| *r == region.name) {
                        match provider.offerings(&region.name).await {
                            Ok(list) => offerings.push((region.name.clone(), list)),
                            Err(e) => {
                                run.attempt(&region.name, &alt.label, ct, e.kind().as_str(), describe_error(&e, None));
                                match e.kind() {
                                    k if k.is_transient() => run.transient = Some(e),
                                    ErrorKind::Unauthorized => run.fatal = Some(e),
                                    // This region's listing failed; the key cools, others go on.
                                    _ => continue,
                                }
                                break 'pod_sets;
                            }
                        }
                    }
                    let list =
                        offerings.iter().find(|(r, _)| *r == region.name).map(|(_, l)| l.clone()).unwrap_or_default();
                    let zone = if same_zone { run.zone.clone() } else { None };
                    let cands = candidates(
                        &list,
                        alt,
                        ct,
                        &input.spec.capacity.reservation_ids,
                        zone.as_deref(),
                        &engine.selectors,
                    );
                    let named = &input.spec.capacity.reservation_ids;
                    if cands.is_empty() && ct == CapacityType::Reserved && !named.is_empty() {
                        let mut others: Vec<String> =
                            candidates(&list, alt, ct, &[], zone.as_deref(), &engine.selectors)
                                .iter()
                                .filter_map(|o| o.reservation_id.clone())
                                .collect();
                        others.sort();
                        others.dedup();
                        if !others.is_empty() {
                            let message = format!(
                                "{} has reservations {} for {}, none of spec.capacity.reservationIds ({})",
                                region.name,
                                others.join(", "),
                                alt.label,
                                named.join(", ")
                            );
                            run.attempt(&region.name, &alt.label, ct, ErrorKind::ReservationMismatch.as_str(), message);
                            continue;
                        }
                    }
                    if cands.is_empty() {
                        let message = format!(
                            "{} lists no {ct} offering of {}{} with free nodes",
                            region.name,
                            alt.label,
                            zone.as_deref().map(|z| format!(" in {z} (sameZone)")).unwrap_or_default()
                        );
                        run.attempt(&region.name, &alt.label, ct, NO_OFFERING, message);
                        continue;
                    }
                    for offering in cands {
                        let per_node = i32::try_from(offering.devices_per_node).unwrap_or(0) / pod_set.devices_per_pod;
                        if per_node <= 0 {
                            continue;
                        }
                        let nodes = (missing + per_node - 1) / per_node;
                        match try_offering(engine, input, provider, pod_set, alt, offering, nodes, run).await {
                            Ok(acq) => {
                                // What this step took is no longer free for later pod sets.
                                if let Some((_, cached)) = offerings.iter_mut().find(|(r, _)| *r == region.name) {
                                    for o in cached.iter_mut().filter(|o| {
                                        o.zone == offering.zone
                                            && o.instance_type == offering.instance_type
                                            && o.capacity_type == offering.capacity_type
                                    }) {
                                        o.available_nodes =
                                            o.available_nodes.map(|n| n.saturating_sub(acq.nodes_granted));
                                    }
                                }
                                let pods = missing.min(acq.nodes_granted as i32 * per_node);
                                missing -= pods;
                                let result = if missing == 0 { "Fulfilled" } else { "PartiallyFulfilled" };
                                run.attempt(
                                    &region.name,
                                    &alt.label,
                                    ct,
                                    result,
                                    format!(
                                        "{}: granted {} of {nodes} node(s) of {} in {} for pod set {}",
                                        acq.id, acq.nodes_granted, offering.instance_type, offering.zone, pod_set.name
                                    ),
                                );
                                if acq.state == AcquisitionState::Provisioning {
                                    run.provisioning = true;
                                }
                                if run.zone.is_none() {
                                    run.zone = acq.zone.clone().or_else(|| Some(offering.zone.clone()));
                                }
                                run.allocations.push(ClaimAllocation {
                                    pod_set: pod_set.name.clone(),
                                    cluster: offering.cluster.clone().unwrap_or_else(|| region.cluster.clone()),
                                    pool: acq.id.clone(),
                                    class: alt.class_for(offering),
                                    capacity_type: Some(ct),
                                    nodes: acq.nodes_granted as i32,
                                    pods,
                                    since: Some(Time(run.now)),
                                });
                                run.acquisitions.push(acq);
                                if missing == 0 {
                                    continue 'pod_sets;
                                }
                            }
                            Err(e) => {
                                run.attempt(
                                    &region.name,
                                    &alt.label,
                                    ct,
                                    e.kind().as_str(),
                                    describe_error(&e, Some(offering)),
                                );
                                match e.kind() {
                                    k if k.is_transient() => {
                                        run.transient = Some(e);
                                        break 'pod_sets;
                                    }
                                    ErrorKind::Unauthorized => {
                                        run.fatal = Some(e);
                                        break 'pod_sets;
                                    }
                                    ErrorKind::QuotaExceeded => {
                                        quota_blocked.insert((region.name.clone(), ct));
                                        break;
                                    }
                                    _ => {}
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One acquisition for one offering; with `placementGroup: Preferred`, a second one without
/// a placement group when the first found no capacity.
#[allow(clippy::too_many_arguments)]
async fn try_offering(
    engine: &ClaimEngine,
    input: &ClaimInput<'_>,
    provider: &dyn CapacityProvider,
    pod_set: &PodSet,
    alt: &Alternative<'_>,
    offering: &Offering,
    nodes: i32,
    run: &mut Run,
) -> Result<Acquisition, ProviderError> {
    let mode = input.spec.topology.as_ref().map(|t| t.placement_group).unwrap_or_default();
    let claim = flotilla_apis::names::owner_key(input.namespace, input.name);
    let class = alt.class_for(offering);
    let name = acquisition_name(input, pod_set, offering, run.attempts.len());
    let mut node_labels = std::collections::BTreeMap::new();
    node_labels.insert(labels::CLASS.to_string(), class.clone());
    node_labels.insert(labels::CLAIM.to_string(), claim.clone());
    node_labels.insert(labels::POOL.to_string(), name.clone());
    node_labels.insert(labels::ACQUISITION.to_string(), name.clone());
    node_labels.insert(labels::MANAGED_BY.to_string(), "flotilla".to_string());
    let policy = input.spec.disruption.clone().unwrap_or_default();
    node_labels.insert(labels::CONSOLIDATION.to_string(), format!("{:?}", policy.consolidation));
    node_labels.insert(labels::SCALE_DOWN.to_string(), format!("{:?}", policy.scale_down));
    let taints = if engine.settings.taint_nodes {
        vec![NodeTaint { key: labels::CLAIM.to_string(), value: claim, effect: TaintEffect::NoSchedule }]
    } else {
        Vec::new()
    };
    let nodes = u32::try_from(nodes).unwrap_or(0);
    let mut request = AcquireRequest {
        name,
        region: offering.region.clone(),
        zones: vec![offering.zone.clone()],
        instance_types: vec![offering.instance_type.clone()],
        capacity_type: offering.capacity_type,
        nodes,
        min_nodes: if mode == PlacementGroupMode::Required { nodes } else { 1 },
        placement_group: mode != PlacementGroupMode::None,
        reservation_id: offering.reservation_id.clone().filter(|_| offering.capacity_type == CapacityType::Reserved),
        class,
        cluster: offering.cluster.clone(),
        labels: node_labels,
        taints,
    };
    match provider.acquire(&request).await {
        Err(e) if mode == PlacementGroupMode::Preferred && e.kind() == ErrorKind::InsufficientCapacity => {
            run.attempt(
                &offering.region,
                &alt.label,
                offering.capacity_type,
                e.kind().as_str(),
                format!("{} (with a placement group; retrying without)", describe_error(&e, Some(offering))),
            );
            request.placement_group = false;
            request.name = format!("{}-n", request.name);
            request.labels.insert(labels::POOL.to_string(), request.name.clone());
            request.labels.insert(labels::ACQUISITION.to_string(), request.name.clone());
            provider.acquire(&request).await
        }
        other => other,
    }
}

fn describe_error(e: &ProviderError, offering: Option<&Offering>) -> String {
    match offering {
        Some(o) => format!("{}: {} [{} in {}]", e.code(), e.message(), o.instance_type, o.zone),
        None => format!("{}: {}", e.code(), e.message()),
    }
}

/// A provider-safe, deterministic name (EKS node group rules: ≤ 63 of `[a-z0-9-]`).
fn acquisition_name(input: &ClaimInput<'_>, pod_set: &PodSet, offering: &Offering, seq: usize) -> String {
    let clean = |s: &str, max: usize| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).take(max).collect()
    };
    let text = format!(
        "{}/{}/{}/{}/{}/{}/{}/{}",
        input.namespace,
        input.name,
        pod_set.name,
        offering.zone,
        offering.instance_type,
        offering.capacity_type,
        input.now.as_second(),
        seq
    );
    let hash = fnv1a64(text.as_bytes());
    format!("{}-{}-{:08x}", clean(input.name, 36), clean(&pod_set.name, 16), hash & 0xffff_ffff)
}
