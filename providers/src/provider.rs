//! The `CapacityProvider` trait: the one door through which the claim engine and the
//! controller ask a cloud (or a simulation of one) for nodes. Requests and answers are the
//! plain types of `types`; failures are `ProviderError`s.

use async_trait::async_trait;

use crate::error::ProviderError;
use crate::types::{AcquireRequest, Acquisition, Offering, RegionInfo};

/// A source of accelerator nodes. Usable as `Arc<dyn CapacityProvider>`.
#[async_trait]
pub trait CapacityProvider: Send + Sync {
    /// Short provider name recorded in claim attempts (`aws`, `sim`, `static`).
    fn name(&self) -> &str;

    /// The regions this provider instance can obtain capacity in, with their jurisdiction.
    /// From configuration: no call to the cloud.
    fn regions(&self) -> Vec<RegionInfo>;

    /// Offerings in a region: instance types per zone and capacity type, devices, prices.
    async fn offerings(&self, region: &str) -> Result<Vec<Offering>, ProviderError>;

    /// Asks for nodes. Repeating a request with the same `name` returns what the first made.
    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquisition, ProviderError>;

    /// What an earlier acquisition holds now, including interruptions.
    async fn describe(&self, region: &str, id: &str) -> Result<Acquisition, ProviderError>;

    /// Changes how many nodes an acquisition holds (scale-up or a drained scale-down).
    /// Providers that cannot resize answer `InvalidRequest` with code `ResizeUnsupported`.
    async fn resize(&self, region: &str, id: &str, nodes: u32) -> Result<Acquisition, ProviderError> {
        let _ = nodes;
        Err(ProviderError::new(
            crate::error::ErrorKind::InvalidRequest,
            "ResizeUnsupported",
            format!("{} cannot resize {id} in {region}; release it and acquire anew", self.name()),
        ))
    }

    /// Shrinks an acquisition to `nodes` by removing the named nodes (the empty ones a claim
    /// chose to give back; `names` may be shorter than the reduction, or empty, when the claim
    /// lets the provider pick). Providers that cannot remove particular nodes shrink to
    /// `nodes` and pick themselves (EKS cordons and drains the nodes it picks).
    async fn remove_nodes(
        &self,
        region: &str,
        id: &str,
        names: &[String],
        nodes: u32,
    ) -> Result<Acquisition, ProviderError> {
        let _ = names;
        self.resize(region, id, nodes).await
    }

    /// Gives an acquisition back. Releasing something already gone succeeds.
    async fn release(&self, region: &str, id: &str) -> Result<(), ProviderError>;

    /// `(region, id)` of every acquisition this provider still holds for `claim`
    /// (`<namespace>.<name>`, the value of the `flotilla.dev/claim` label the engine puts on
    /// every request), whatever the claim's status recorded: what the finalizer must give
    /// back when a claim goes before its first status write. Released acquisitions are not
    /// listed. An error means the listing is unknown, not that the claim holds nothing.
    async fn held_by(&self, claim: &str) -> Result<Vec<(String, String)>, ProviderError>;
}
