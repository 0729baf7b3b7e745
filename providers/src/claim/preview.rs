//! What the engine would try for a claim, without asking for anything: in go the claim's spec,
//! the classes, the regions a provider serves and the offerings it lists; out come the
//! offerings in the order the engine's search walks them (pod sets, then capacity types in
//! the claim's order × device-class alternatives × allowed regions, cheapest first, through
//! `search::alternatives` and `search::candidates`), each with the nodes it would ask for —
//! or why there is nothing to try. `fleetctl plan` shows this offline. It ignores what a
//! running claim remembers (allocations, offerings cooling down, quota met along the way).

use std::collections::BTreeMap;

use flotilla_apis::cel::SelectorEngine;
use flotilla_apis::claim::CapacityClaimSpec;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::common::CapacityType;
use serde::Serialize;

use super::search::{alternatives, candidates};
use crate::error::ProviderError;
use crate::provider::CapacityProvider;
use crate::types::{Offering, RegionInfo};

/// One offering the engine would try, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Try {
    /// The pod set it would serve.
    pub pod_set: String,
    /// The provider serving the region (`static`, `sim`, `aws`).
    pub provider: String,
    /// Region.
    pub region: String,
    /// The InferenceCluster the nodes would join.
    pub cluster: String,
    /// Zone.
    pub zone: String,
    /// Instance type (for static pools, the pool's name).
    pub instance_type: String,
    /// Capacity type.
    pub capacity_type: CapacityType,
    /// The class the allocation would record.
    pub class: String,
    /// The device alternative's position in the claim's fallback order (1 = first choice).
    pub fallback_rank: usize,
    /// USD per node-hour in millionths, when known.
    pub price_micros: Option<u64>,
    /// Nodes the engine would ask for.
    pub nodes: u32,
    /// Nodes the provider says are free, when it says.
    pub available_nodes: Option<u32>,
}

/// Why the engine would have nothing to try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoTry {
    /// The claim is invalid (a class that does not exist, a selector that does not compile).
    Invalid(String),
    /// No region any provider serves is allowed by `spec.capacity.sovereignty`; the regions
    /// offered, as `name (jurisdiction)`.
    NoAllowedRegion(Vec<String>),
    /// No allowed region lists an offering of any device alternative, in any of the capacity
    /// types, for this pod set.
    NoOffering {
        /// The pod set.
        pod_set: String,
        /// The alternatives' labels, in fallback order.
        alternatives: Vec<String>,
        /// The capacity types, in order.
        capacity_types: Vec<CapacityType>,
        /// The allowed regions searched.
        regions: Vec<String>,
    },
}

impl std::fmt::Display for NoTry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or = |v: &[String]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
        match self {
            Self::Invalid(message) => f.write_str(message),
            Self::NoAllowedRegion(offered) => write!(
                f,
                "no provider offers capacity in a region spec.capacity.sovereignty allows (regions served: {})",
                or(offered)
            ),
            Self::NoOffering { pod_set, alternatives, capacity_types, regions } => {
                let types: Vec<String> = capacity_types.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "no provider offers {} as {} in the allowed regions ({}) for pod set {pod_set}",
                    alternatives.join(" or "),
                    types.join(" or "),
                    or(regions)
                )
            }
        }
    }
}

/// The regions of `regions` allowed by the claim's sovereignty, in the provider's order.
pub fn allowed_regions<'r>(spec: &CapacityClaimSpec, regions: &'r [RegionInfo]) -> Vec<&'r RegionInfo> {
    let sovereignty = spec.capacity.sovereignty.clone().unwrap_or_default();
    regions.iter().filter(|r| sovereignty.allows(&r.jurisdiction, &r.name)).collect()
}

/// The offerings `provider` lists in the regions the claim allows (one `offerings` call per
/// allowed region; none elsewhere).
pub async fn gather(
    spec: &CapacityClaimSpec,
    provider: &dyn CapacityProvider,
) -> Result<(Vec<RegionInfo>, Vec<Offering>), ProviderError> {
    let regions = provider.regions();
    let mut offerings = Vec::new();
    let mut listed: Vec<&str> = Vec::new();
    for region in allowed_regions(spec, &regions) {
        // One listing per region, however many clusters it holds.
        if !listed.contains(&region.name.as_str()) {
            listed.push(&region.name);
            offerings.extend(provider.offerings(&region.name).await?);
        }
    }
    Ok((regions, offerings))
}

/// The offerings the engine would try for `spec`, in order, or why there are none.
/// `offerings` may span regions; those outside the allowed regions are never tried.
pub fn preview(
    spec: &CapacityClaimSpec,
    classes: &BTreeMap<String, InferenceClassSpec>,
    regions: &[RegionInfo],
    offerings: &[Offering],
    engine: &SelectorEngine,
) -> Result<Vec<Try>, NoTry> {
    let alts = alternatives(spec, classes, engine).map_err(NoTry::Invalid)?;
    let mut allowed = allowed_regions(spec, regions);
    if allowed.is_empty() {
        return Err(NoTry::NoAllowedRegion(
            regions.iter().map(|r| format!("{} ({})", r.name, r.jurisdiction)).collect(),
        ));
    }
    let mut capacity_types: Vec<CapacityType> = Vec::new();
    for ct in &spec.capacity.capacity_types {
        if !capacity_types.contains(ct) {
            capacity_types.push(*ct);
        }
    }
    // A region is tried once, however many clusters it holds: its offerings name their cluster.
    let mut seen: Vec<&str> = Vec::new();
    allowed.retain(|r| {
        let first = !seen.contains(&r.name.as_str());
        seen.push(&r.name);
        first
    });
    let mut tries = Vec::new();
    for pod_set in &spec.pod_sets {
        let before = tries.len();
        for &ct in &capacity_types {
            for alt in &alts {
                for region in &allowed {
                    let listed: Vec<Offering> = offerings.iter().filter(|o| o.region == region.name).cloned().collect();
                    let cands = candidates(&listed, alt, ct, &spec.capacity.reservation_ids, None, engine);
                    for o in cands {
                        let per_node = i32::try_from(o.devices_per_node).unwrap_or(0) / pod_set.devices_per_pod.max(1);
                        if per_node <= 0 {
                            continue;
                        }
                        let nodes = (pod_set.count.max(0) + per_node - 1) / per_node;
                        tries.push(Try {
                            pod_set: pod_set.name.clone(),
                            provider: region.provider.clone(),
                            region: region.name.clone(),
                            cluster: o.cluster.clone().unwrap_or_else(|| region.cluster.clone()),
                            zone: o.zone.clone(),
                            instance_type: o.instance_type.clone(),
                            capacity_type: ct,
                            class: alt.class_for(o),
                            fallback_rank: alt.rank + 1,
                            price_micros: alt.price(o, ct),
                            nodes: u32::try_from(nodes).unwrap_or(0),
                            available_nodes: o.available_nodes,
                        });
                    }
                }
            }
        }
        if tries.len() == before && pod_set.count > 0 {
            return Err(NoTry::NoOffering {
                pod_set: pod_set.name.clone(),
                alternatives: alts.iter().map(|a| a.label.clone()).collect(),
                capacity_types,
                regions: allowed.iter().map(|r| r.name.clone()).collect(),
            });
        }
    }
    Ok(tries)
}

#[cfg(test)]
#[path = "preview_tests.rs"]
mod tests;
