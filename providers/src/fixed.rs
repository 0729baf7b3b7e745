//! The `static` provider, for fleets whose capacity is fixed (on-premises, colocation): its
//! offerings are the declared pools of `static` InferenceClusters (one per zone and capacity
//! type the pool lists), its "acquisitions" set declared nodes aside for a claim, and asking
//! for more than a pool declares fails with `InsufficientCapacity` (code
//! `StaticPoolExhausted`). A region may hold several static clusters (two on-premises
//! clusters at one site): each is listed as its own [`RegionInfo`], each offering names its
//! cluster, and an acquisition is made in the cluster the request names.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::cluster::{InferenceClusterSpec, NodePool};
use flotilla_apis::constants::labels::CLAIM as CLAIM_LABEL;

use crate::error::{ErrorKind, ProviderError};
use crate::provider::CapacityProvider;
use crate::types::{AcquireRequest, Acquisition, AcquisitionState, Offering, ProvisionedNode, RegionInfo};

struct Held {
    acquisition: Acquisition,
    /// The cluster whose pool the nodes belong to.
    cluster: String,
    pool: String,
    indices: Vec<u32>,
    /// The request's `flotilla.dev/claim` label.
    claim: Option<String>,
}

/// Fixed inventory from `static` InferenceClusters (any number per region).
pub struct StaticProvider {
    clusters: Vec<(String, InferenceClusterSpec)>,
    classes: BTreeMap<String, InferenceClassSpec>,
    held: Mutex<BTreeMap<String, Held>>,
}

impl std::fmt::Debug for StaticProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticProvider").field("clusters", &self.clusters.len()).finish_non_exhaustive()
    }
}

impl StaticProvider {
    /// Inventory from `(name, spec)` of InferenceClusters; clusters whose provider is not
    /// `static` are ignored, as are pools of unknown classes.
    pub fn new(clusters: Vec<(String, InferenceClusterSpec)>, classes: BTreeMap<String, InferenceClassSpec>) -> Self {
        let clusters = clusters.into_iter().filter(|(_, spec)| spec.provider.static_.is_some()).collect();
        Self { clusters, classes, held: Mutex::new(BTreeMap::new()) }
    }

    fn held(&self) -> MutexGuard<'_, BTreeMap<String, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The static clusters in `region`, in the order given; an error when there is none.
    fn clusters_in(&self, region: &str) -> Result<Vec<&(String, InferenceClusterSpec)>, ProviderError> {
        let found: Vec<_> = self.clusters.iter().filter(|(_, s)| s.region == region).collect();
        if found.is_empty() {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "UnknownRegion",
                format!("no static cluster in {region}"),
            ));
        }
        Ok(found)
    }

    fn zone(spec: &InferenceClusterSpec) -> String {
        spec.zones.first().cloned().unwrap_or_else(|| spec.region.clone())
    }

    fn used(held: &BTreeMap<String, Held>, cluster: &str, pool: &str) -> Vec<u32> {
        held.values()
            .filter(|h| h.pool == pool && h.cluster == cluster)
            .flat_map(|h| h.indices.iter().copied())
            .collect()
    }

    fn declared(pool: &NodePool) -> u32 {
        u32::try_from(pool.nodes.unwrap_or(pool.max_nodes)).unwrap_or(0)
    }
}

#[async_trait]
impl CapacityProvider for StaticProvider {
    fn name(&self) -> &str {
        "static"
    }

    fn regions(&self) -> Vec<RegionInfo> {
        self.clusters
            .iter()
            .map(|(name, s)| RegionInfo {
                provider: "static".to_string(),
                name: s.region.clone(),
                jurisdiction: s.jurisdiction.0.clone(),
                cluster: name.clone(),
                zones: s.zones.clone(),
            })
            .collect()
    }

    async fn offerings(&self, region: &str) -> Result<Vec<Offering>, ProviderError> {
        let clusters = self.clusters_in(region)?;
        let held = self.held();
        let mut out = Vec::new();
        for (name, spec) in clusters {
            for pool in &spec.pools {
                let Some(class) = self.classes.get(&pool.class) else { continue };
                let free = Self::declared(pool).saturating_sub(Self::used(&held, name, &pool.name).len() as u32);
                for ct in &pool.capacity_types {
                    out.push(Offering {
                        region: region.to_string(),
                        zone: Self::zone(spec),
                        instance_type: pool.name.clone(),
                        capacity_type: *ct,
                        device: class.device.clone(),
                        devices_per_node: class.devices_per_node,
                        price_micros: class.price_per_node_hour.micros(*ct),
                        reservation_id: pool.reservation_ids.first().cloned(),
                        available_nodes: Some(free),
                        ends_at: None,
                        class: Some(pool.class.clone()),
                        cluster: Some(name.clone()),
                    });
                }
            }
        }
        Ok(out)
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquisition, ProviderError> {
        let clusters = self.clusters_in(&request.region)?;
        let mut held = self.held();
        if let Some(h) = held.get(&request.name) {
            return Ok(h.acquisition.clone());
        }
        // The cluster the request names (the offering's); without one, the only cluster of
        // the region — with several, a request that names none is ambiguous.
        let cluster = match &request.cluster {
            Some(want) => clusters.iter().copied().find(|(name, _)| name == want),
            None if clusters.len() == 1 => clusters.first().copied(),
            None => {
                let names: Vec<&str> = clusters.iter().map(|(n, _)| n.as_str()).collect();
                return Err(ProviderError::new(
                    ErrorKind::InvalidRequest,
                    "StaticClusterAmbiguous",
                    format!(
                        "region {} holds static clusters {}; the request names none of them",
                        request.region,
                        names.join(", ")
                    ),
                ));
            }
        };
        let Some((cluster, spec)) = cluster else {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "UnknownRegion",
                format!("no static cluster {} in {}", request.cluster.as_deref().unwrap_or_default(), request.region),
            ));
        };
        let Some(pool) = spec
            .pools
            .iter()
            .find(|p| request.instance_types.contains(&p.name) && p.capacity_types.contains(&request.capacity_type))
        else {
            return Err(ProviderError::new(
                ErrorKind::CapacityTypeUnavailable,
                "StaticPoolNotFound",
                format!(
                    "cluster {cluster} has no pool {} offering {}",
                    request.instance_types.join(", "),
                    request.capacity_type
                ),
            ));
        };
        let taken = Self::used(&held, cluster, &pool.name);
        let free: Vec<u32> = (0..Self::declared(pool)).filter(|i| !taken.contains(i)).collect();
        let grant = request.nodes.min(free.len() as u32);
        if grant < request.min_nodes.max(1) {
            return Err(ProviderError::new(
                ErrorKind::InsufficientCapacity,
                "StaticPoolExhausted",
                format!(
                    "pool {} of cluster {cluster} declares {} node(s), {} free; asked for {} — a static fleet does \
                     not grow: add nodes to the pool or lower the claim",
                    pool.name,
                    Self::declared(pool),
                    free.len(),
                    request.nodes
                ),
            ));
        }
        let indices: Vec<u32> = free.into_iter().take(grant as usize).collect();
        let zone = Self::zone(spec);
        let class = self.classes.get(&pool.class);
        let nodes = indices
            .iter()
            .map(|i| ProvisionedNode {
                name: format!("{cluster}-{}-{i}", pool.name),
                zone: zone.clone(),
                instance_type: pool.name.clone(),
                capacity_type: request.capacity_type,
                class: pool.class.clone(),
                labels: request.labels.clone(),
                taints: request.taints.clone(),
                device: class.map(|c| c.device.clone()).unwrap_or_default(),
                devices: class.map_or(0, |c| c.devices_per_node),
                ready: true,
            })
            .collect();
        let acquisition = Acquisition {
            id: request.name.clone(),
            region: request.region.clone(),
            zone: Some(zone),
            instance_type: pool.name.clone(),
            capacity_type: request.capacity_type,
            class: pool.class.clone(),
            nodes_granted: grant,
            state: AcquisitionState::Active,
            nodes,
            events: Vec::new(),
            message: format!("{grant} declared node(s) of pool {} set aside", pool.name),
            failure: None,
        };
        let claim = request.labels.get(CLAIM_LABEL).cloned();
        held.insert(
            request.name.clone(),
            Held {
                acquisition: acquisition.clone(),
                cluster: cluster.clone(),
                pool: pool.name.clone(),
                indices,
                claim,
            },
        );
        Ok(acquisition)
    }

    async fn describe(&self, region: &str, id: &str) -> Result<Acquisition, ProviderError> {
        self.held().get(id).filter(|h| h.acquisition.region == region).map(|h| h.acquisition.clone()).ok_or_else(|| {
            ProviderError::new(ErrorKind::InvalidRequest, "ResourceNotFoundException", format!("no acquisition {id}"))
        })
    }

    async fn release(&self, _region: &str, id: &str) -> Result<(), ProviderError> {
        self.held().remove(id);
        Ok(())
    }

    async fn held_by(&self, claim: &str) -> Result<Vec<(String, String)>, ProviderError> {
        Ok(self
            .held()
            .values()
            .filter(|h| h.claim.as_deref() == Some(claim))
            .map(|h| (h.acquisition.region.clone(), h.acquisition.id.clone()))
            .collect())
    }
}
