//! The `CapacityProvider` trait: the one door through which the claim engine and the
//! controller ask a cloud (or a simulation of one) for nodes. Requests and answers are the
//! plain types of `types`; failures are `ProviderError`s.

use async_trait::async_trait;

use crate::error::ProviderError;
use crate::types::{AcquireRequest, Acquisition, NodeRemoval, Offering, RegionInfo};

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

    /// Shrinks an acquisition as `removal` says: the named nodes (the empty ones a claim chose
    /// to give back) go first; beyond them the provider picks only when
    /// `removal.provider_may_choose`. The answer's `nodes_granted` is what the acquisition holds
    /// afterwards, which is more than `removal.nodes` when fewer nodes could be named than the
    /// reduction asks and the provider may not choose. Providers that cannot remove particular
    /// nodes shrink by size where they may choose, and otherwise answer `InvalidRequest` with
    /// code `NamedRemovalUnsupported` (shrinking by size would let them take a busy node).
    async fn remove_nodes(&self, region: &str, id: &str, removal: &NodeRemoval) -> Result<Acquisition, ProviderError> {
        if removal.provider_may_choose {
            return self.resize(region, id, removal.nodes).await;
        }
        Err(ProviderError::new(
            crate::error::ErrorKind::InvalidRequest,
            "NamedRemovalUnsupported",
            format!(
                "{} cannot remove particular nodes of {id} in {region}, and the claim's disruption policy gives back \
                 only the empty ones it names",
                self.name()
            ),
        ))
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
