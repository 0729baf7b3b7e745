//! The simulated provider: regions with their jurisdiction, zones, offerings, prices and
//! quotas from a `SimCloud`; acquisitions take nodes from per-zone pools and become ready after
//! a provisioning delay on an injected clock; scripted failures and interruptions (spot
//! reclaim, capacity-block end) show up in `describe`. Node names derive from the seed, so a
//! run is deterministic. It never talks to Kubernetes: `describe` lists the nodes it
//! "provisioned" for the controller to materialise (e.g. as kwok fake nodes).

mod config;
pub mod file;
mod state;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use flotilla_apis::common::CapacityType;
use flotilla_apis::constants::labels;
use k8s_openapi::jiff::Timestamp;

pub use config::{FailureRule, SimCloud, SimOffering, SimRegion};
pub use state::CallLog;

use state::{SimAcquisition, hash};

use crate::clock::{Clock, add};
use crate::error::{ErrorKind, ProviderError};
use crate::provider::CapacityProvider;
use crate::types::{AcquireRequest, Acquisition, AcquisitionState, NodeRemoval, Offering, ProvisionedNode, RegionInfo};

#[derive(Debug, Default)]
struct State {
    acquisitions: BTreeMap<String, SimAcquisition>,
    rules: Vec<FailureRule>,
    calls: CallLog,
}

/// A simulated cloud behind the `CapacityProvider` trait.
pub struct SimProvider {
    cloud: SimCloud,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl std::fmt::Debug for SimProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimProvider").field("cloud", &self.cloud.name).finish_non_exhaustive()
    }
}

impl SimProvider {
    /// A simulated cloud reading time from `clock`.
    pub fn new(cloud: SimCloud, clock: Arc<dyn Clock>) -> Self {
        Self { cloud, clock, state: Mutex::new(State::default()) }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Scripts a failure for matching acquisitions.
    pub fn add_failure(&self, rule: FailureRule) {
        self.state().rules.push(rule);
    }

    /// Removes every scripted failure.
    pub fn clear_failures(&self) {
        self.state().rules.clear();
    }

    /// Schedules a spot interruption of acquisition `id` at `at`.
    pub fn interrupt(&self, id: &str, at: Timestamp) {
        if let Some(acq) = self.state().acquisitions.get_mut(id) {
            acq.interrupt_at = Some(at);
        }
    }

    /// Moves the end of acquisition `id`'s capacity block to `at`.
    pub fn end_capacity_block(&self, id: &str, at: Timestamp) {
        if let Some(acq) = self.state().acquisitions.get_mut(id) {
            acq.ends_at = Some(at);
        }
    }

    /// Every call received so far.
    pub fn calls(&self) -> CallLog {
        self.state().calls.clone()
    }

    /// Every acquisition, as `describe` would show it now.
    pub fn acquisitions(&self) -> Vec<Acquisition> {
        let now = self.clock.now();
        self.state().acquisitions.values().map(|a| a.at(now)).collect()
    }

    fn region(&self, name: &str) -> Result<&SimRegion, ProviderError> {
        self.cloud.regions.iter().find(|r| r.name == name).ok_or_else(|| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                "UnknownRegion",
                format!("no region {name} in {}", self.cloud.name),
            )
        })
    }

    fn zones<'a>(region: &'a SimRegion, offering: &'a SimOffering) -> &'a [String] {
        if offering.zones.is_empty() { &region.zones } else { &offering.zones }
    }

    fn used(state: &State, now: Timestamp, region: &str, filter: impl Fn(&Acquisition) -> bool) -> u32 {
        state
            .acquisitions
            .values()
            .filter(|a| a.view.region == region && a.holds(now) && filter(&a.view))
            .map(|a| a.view.nodes_granted)
            .sum()
    }

    fn scripted(state: &mut State, request: &AcquireRequest) -> Option<ProviderError> {
        let rule = state.rules.iter_mut().find(|r| {
            r.times != Some(0)
                && r.region.as_ref().is_none_or(|x| *x == request.region)
                && r.capacity_type.is_none_or(|x| x == request.capacity_type)
                && r.instance_type.as_ref().is_none_or(|x| request.instance_types.contains(x))
        })?;
        if let Some(times) = rule.times.as_mut() {
            *times -= 1;
        }
        Some(rule.error.clone())
    }

    fn create(
        &self,
        state: &mut State,
        request: &AcquireRequest,
        now: Timestamp,
    ) -> Result<Acquisition, ProviderError> {
        let region = self.region(&request.region)?;
        let candidates: Vec<&SimOffering> = region
            .offerings
            .iter()
            .filter(|o| o.capacity_type == request.capacity_type && request.instance_types.contains(&o.instance_type))
            .collect();
        if candidates.is_empty() {
            return Err(ProviderError::new(
                ErrorKind::CapacityTypeUnavailable,
                "Unsupported",
                format!(
                    "{} is not offered as {} in {}",
                    request.instance_types.join(", "),
                    request.capacity_type,
                    region.name
                ),
            ));
        }
        if request.capacity_type == CapacityType::Reserved {
            let wanted = request.reservation_id.as_deref();
            if !candidates.iter().any(|o| wanted.is_none() || o.reservation_id.as_deref() == wanted) {
                return Err(ProviderError::new(
                    ErrorKind::ReservationMismatch,
                    "InvalidCapacityReservationId.Mismatch",
                    format!(
                        "reservation {} does not cover {} in {}",
                        wanted.unwrap_or("-"),
                        request.instance_types.join(", "),
                        region.name
                    ),
                ));
            }
        }
        let remaining = match region.quota_nodes {
            Some(quota) => quota.saturating_sub(Self::used(state, now, &region.name, |_| true)),
            None => u32::MAX,
        };
        if remaining < request.min_nodes.max(1) {
            return Err(ProviderError::new(
                ErrorKind::QuotaExceeded,
                "VcpuLimitExceeded",
                format!(
                    "You have requested more instances ({}) than your current quota in {} allows ({remaining} more)",
                    request.min_nodes.max(1),
                    region.name
                ),
            ));
        }
        for offering in candidates {
            if request.capacity_type == CapacityType::Reserved
                && request.reservation_id.is_some()
                && offering.reservation_id != request.reservation_id
            {
                continue;
            }
            for zone in Self::zones(region, offering) {
                if !request.zones.is_empty() && !request.zones.contains(zone) {
                    continue;
                }
                let taken = Self::used(state, now, &region.name, |a| {
                    a.instance_type == offering.instance_type
                        && a.capacity_type == offering.capacity_type
                        && a.zone.as_deref() == Some(zone.as_str())
                });
                let grant = request.nodes.min(offering.nodes_per_zone.saturating_sub(taken)).min(remaining);
                if grant >= request.min_nodes.max(1) {
                    return Ok(self.record(state, request, offering, zone, grant, now));
                }
            }
        }
        Err(ProviderError::new(
            ErrorKind::InsufficientCapacity,
            "InsufficientInstanceCapacity",
            format!(
                "We currently do not have sufficient {} {} capacity in the zones you requested ({})",
                request.instance_types.join(", "),
                request.capacity_type,
                if request.zones.is_empty() { region.zones.join(", ") } else { request.zones.join(", ") }
            ),
        ))
    }

    fn record(
        &self,
        state: &mut State,
        request: &AcquireRequest,
        offering: &SimOffering,
        zone: &str,
        grant: u32,
        now: Timestamp,
    ) -> Acquisition {
        let nodes = (0..grant)
            .map(|i| {
                let mut labels = request.labels.clone();
                labels.insert("topology.kubernetes.io/zone".into(), zone.to_string());
                labels.insert("topology.kubernetes.io/region".into(), request.region.clone());
                labels.insert("node.kubernetes.io/instance-type".into(), offering.instance_type.clone());
                labels.insert("karpenter.sh/capacity-type".into(), offering.capacity_type.to_string());
                ProvisionedNode {
                    name: format!(
                        "{}-{:06x}",
                        request.name,
                        hash(self.cloud.seed, &request.name, u64::from(i)) & 0xff_ffff
                    ),
                    zone: zone.to_string(),
                    instance_type: offering.instance_type.clone(),
                    capacity_type: offering.capacity_type,
                    class: offering.class.clone(),
                    labels,
                    taints: request.taints.clone(),
                    device: offering.device.clone(),
                    devices: offering.devices_per_node,
                    ready: false,
                }
            })
            .collect();
        let jitter_ms = u64::try_from(self.cloud.provisioning_jitter.as_millis()).unwrap_or(u64::MAX);
        let jitter = match jitter_ms {
            0 => std::time::Duration::ZERO,
            ms => std::time::Duration::from_millis(hash(self.cloud.seed, &request.name, u64::MAX) % ms),
        };
        let acquisition = SimAcquisition {
            view: Acquisition {
                id: request.name.clone(),
                region: request.region.clone(),
                zone: Some(zone.to_string()),
                instance_type: offering.instance_type.clone(),
                capacity_type: offering.capacity_type,
                class: offering.class.clone(),
                nodes_granted: grant,
                state: AcquisitionState::Provisioning,
                nodes,
                events: Vec::new(),
                message: String::new(),
                failure: None,
            },
            ready_at: add(add(now, self.cloud.provisioning_delay), jitter),
            ends_at: offering.ends_at,
            interrupt_at: None,
            released: false,
            claim: request.labels.get(labels::CLAIM).cloned(),
        };
        let view = acquisition.at(now);
        state.acquisitions.insert(request.name.clone(), acquisition);
        view
    }
}

#[async_trait]
impl CapacityProvider for SimProvider {
    fn name(&self) -> &str {
        &self.cloud.name
    }

    fn regions(&self) -> Vec<RegionInfo> {
        self.cloud
            .regions
            .iter()
            .map(|r| RegionInfo {
                provider: self.cloud.name.clone(),
                name: r.name.clone(),
                jurisdiction: r.jurisdiction.clone(),
                cluster: r.cluster.clone(),
                zones: r.zones.clone(),
            })
            .collect()
    }

    async fn offerings(&self, region: &str) -> Result<Vec<Offering>, ProviderError> {
        let now = self.clock.now();
        let mut state = self.state();
        state.calls.offerings.push(region.to_string());
        let region = self.region(region)?;
        let mut out = Vec::new();
        for o in &region.offerings {
            for zone in Self::zones(region, o) {
                let taken = Self::used(&state, now, &region.name, |a| {
                    a.instance_type == o.instance_type
                        && a.capacity_type == o.capacity_type
                        && a.zone.as_deref() == Some(zone.as_str())
                });
                out.push(Offering {
                    region: region.name.clone(),
                    zone: zone.clone(),
                    instance_type: o.instance_type.clone(),
                    capacity_type: o.capacity_type,
                    device: o.device.clone(),
                    devices_per_node: o.devices_per_node,
                    price_micros: Some(o.price_micros),
                    reservation_id: o.reservation_id.clone(),
                    available_nodes: Some(o.nodes_per_zone.saturating_sub(taken)),
                    ends_at: o.ends_at,
                    class: Some(o.class.clone()),
                    cluster: None,
                });
            }
        }
        Ok(out)
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquisition, ProviderError> {
        let now = self.clock.now();
        let mut state = self.state();
        state.calls.acquire.push(request.clone());
        if let Some(existing) = state.acquisitions.get(&request.name).filter(|a| !a.released) {
            return Ok(existing.at(now));
        }
        if let Some(error) = Self::scripted(&mut state, request) {
            return Err(error);
        }
        self.create(&mut state, request, now)
    }

    async fn describe(&self, region: &str, id: &str) -> Result<Acquisition, ProviderError> {
        let now = self.clock.now();
        let mut state = self.state();
        state.calls.describe.push((region.to_string(), id.to_string()));
        state
            .acquisitions
            .get(id)
            .filter(|a| a.view.region == region)
            .map(|a| a.at(now))
            .ok_or_else(|| not_found(region, id))
    }

    async fn resize(&self, region: &str, id: &str, nodes: u32) -> Result<Acquisition, ProviderError> {
        let now = self.clock.now();
        let mut state = self.state();
        state.calls.resize.push((region.to_string(), id.to_string(), nodes));
        let not_found = || not_found(region, id);
        let acq =
            state.acquisitions.get(id).filter(|a| a.view.region == region && a.holds(now)).ok_or_else(not_found)?;
        let view = acq.view.clone();
        let current = view.nodes_granted;
        if nodes > current {
            let sim_region = self.region(region)?;
            let zone = view.zone.clone().unwrap_or_default();
            let per_zone = sim_region
                .offerings
                .iter()
                .find(|o| o.instance_type == view.instance_type && o.capacity_type == view.capacity_type)
                .map_or(0, |o| o.nodes_per_zone);
            let taken = Self::used(&state, now, region, |a| {
                a.instance_type == view.instance_type
                    && a.capacity_type == view.capacity_type
                    && a.zone.as_deref() == Some(zone.as_str())
            });
            if taken + (nodes - current) > per_zone {
                return Err(ProviderError::new(
                    ErrorKind::InsufficientCapacity,
                    "InsufficientInstanceCapacity",
                    format!("We currently do not have sufficient {} capacity in {zone}", view.instance_type),
                ));
            }
            let used = Self::used(&state, now, region, |_| true);
            if sim_region.quota_nodes.is_some_and(|q| used + (nodes - current) > q) {
                return Err(ProviderError::new(
                    ErrorKind::QuotaExceeded,
                    "VcpuLimitExceeded",
                    format!("growing {id} to {nodes} node(s) exceeds the quota of {region}"),
                ));
            }
        }
        let seed = self.cloud.seed;
        let delay = self.cloud.provisioning_delay;
        let acq = state.acquisitions.get_mut(id).ok_or_else(not_found)?;
        let template = acq.view.nodes.first().cloned().ok_or_else(not_found)?;
        acq.view.nodes.truncate(nodes as usize);
        for i in current..nodes {
            let name = format!("{id}-{:06x}", hash(seed, id, u64::from(i)) & 0xff_ffff);
            acq.view.nodes.push(ProvisionedNode { name, ready: false, ..template.clone() });
        }
        if nodes > current {
            acq.ready_at = acq.ready_at.max(add(now, delay));
        }
        acq.view.nodes_granted = nodes;
        Ok(acq.at(now))
    }

    /// The named nodes go first, then (if the claim named fewer) the newest: in the simulation
    /// those are the ones that have not joined yet, so this holds whatever the claim allows.
    async fn remove_nodes(&self, region: &str, id: &str, removal: &NodeRemoval) -> Result<Acquisition, ProviderError> {
        let nodes = removal.nodes;
        let names: Vec<&str> = removal.named.iter().map(|n| n.name.as_str()).collect();
        let now = self.clock.now();
        let grows = {
            let state = self.state();
            let held = state.acquisitions.get(id).filter(|a| a.view.region == region && a.holds(now));
            held.ok_or_else(|| not_found(region, id))?.view.nodes_granted < nodes
        };
        if grows {
            return self.resize(region, id, nodes).await;
        }
        let mut state = self.state();
        state.calls.resize.push((region.to_string(), id.to_string(), nodes));
        let acq = state.acquisitions.get_mut(id).ok_or_else(|| not_found(region, id))?;
        acq.view.nodes.retain(|n| !names.contains(&n.name.as_str()));
        acq.view.nodes.truncate(nodes as usize);
        acq.view.nodes_granted = nodes;
        Ok(acq.at(now))
    }

    async fn release(&self, region: &str, id: &str) -> Result<(), ProviderError> {
        let mut state = self.state();
        state.calls.release.push((region.to_string(), id.to_string()));
        if let Some(acq) = state.acquisitions.get_mut(id).filter(|a| a.view.region == region) {
            acq.released = true;
        }
        Ok(())
    }

    async fn held_by(&self, claim: &str) -> Result<Vec<(String, String)>, ProviderError> {
        Ok(self
            .state()
            .acquisitions
            .values()
            .filter(|a| !a.released && a.claim.as_deref() == Some(claim))
            .map(|a| (a.view.region.clone(), a.view.id.clone()))
            .collect())
    }
}

/// The provider's answer for an acquisition it does not hold (EKS's code for a missing node group).
fn not_found(region: &str, id: &str) -> ProviderError {
    ProviderError::new(
        ErrorKind::InvalidRequest,
        "ResourceNotFoundException",
        format!("no acquisition {id} in {region}"),
    )
}
