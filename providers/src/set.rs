//! A `ProviderSet`: several providers behind one `CapacityProvider`, each call routed by
//! region, so one claim step can search a fleet whose clusters run on different providers
//! (AWS regions, a static site, a simulated cloud). Attempts still record the provider that
//! serves each region.

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{ErrorKind, ProviderError};
use crate::provider::CapacityProvider;
use crate::types::{AcquireRequest, Acquisition, NodeRemoval, Offering, RegionInfo};

/// Providers routed by region.
#[derive(Clone)]
pub struct ProviderSet {
    providers: Vec<Arc<dyn CapacityProvider>>,
}

impl std::fmt::Debug for ProviderSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.providers.iter().map(|p| p.name().to_string())).finish()
    }
}

impl ProviderSet {
    /// Combines providers; fails when two of them serve the same region name (a call names
    /// only a region, so it could not be routed). One provider may list a region several
    /// times, once per cluster it holds there (a static site with two clusters).
    pub fn new(providers: Vec<Arc<dyn CapacityProvider>>) -> Result<Self, ProviderError> {
        let mut seen: Vec<(usize, RegionInfo)> = Vec::new();
        for (pi, p) in providers.iter().enumerate() {
            for region in p.regions() {
                if let Some((_, other)) = seen.iter().find(|(i, r)| *i != pi && r.name == region.name) {
                    return Err(ProviderError::new(
                        ErrorKind::InvalidRequest,
                        "DuplicateRegion",
                        format!(
                            "region {} is served by both {} (cluster {}) and {} (cluster {}); give one of them \
                             another region name",
                            region.name, other.provider, other.cluster, region.provider, region.cluster
                        ),
                    ));
                }
                seen.push((pi, region));
            }
        }
        Ok(Self { providers })
    }

    fn route(&self, region: &str) -> Result<&Arc<dyn CapacityProvider>, ProviderError> {
        self.providers.iter().find(|p| p.regions().iter().any(|r| r.name == region)).ok_or_else(|| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                "UnknownRegion",
                format!("no provider serves region {region}"),
            )
        })
    }
}

#[async_trait]
impl CapacityProvider for ProviderSet {
    fn name(&self) -> &str {
        "set"
    }

    fn regions(&self) -> Vec<RegionInfo> {
        self.providers.iter().flat_map(|p| p.regions()).collect()
    }

    async fn offerings(&self, region: &str) -> Result<Vec<Offering>, ProviderError> {
        self.route(region)?.offerings(region).await
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquisition, ProviderError> {
        self.route(&request.region)?.acquire(request).await
    }

    async fn describe(&self, region: &str, id: &str) -> Result<Acquisition, ProviderError> {
        self.route(region)?.describe(region, id).await
    }

    async fn resize(&self, region: &str, id: &str, nodes: u32) -> Result<Acquisition, ProviderError> {
        self.route(region)?.resize(region, id, nodes).await
    }

    async fn remove_nodes(&self, region: &str, id: &str, removal: &NodeRemoval) -> Result<Acquisition, ProviderError> {
        self.route(region)?.remove_nodes(region, id, removal).await
    }

    async fn release(&self, region: &str, id: &str) -> Result<(), ProviderError> {
        self.route(region)?.release(region, id).await
    }

    /// The union over every member; the first member that cannot list fails the whole
    /// listing (the caller retries), so nothing held is silently left out.
    async fn held_by(&self, claim: &str) -> Result<Vec<(String, String)>, ProviderError> {
        let mut out = Vec::new();
        for p in &self.providers {
            for held in p.held_by(claim).await? {
                if !out.contains(&held) {
                    out.push(held);
                }
            }
        }
        Ok(out)
    }
}
