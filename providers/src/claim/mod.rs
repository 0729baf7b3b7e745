//! The CapacityClaim engine: a step function the controller calls on every reconcile. In go
//! the claim's spec, its previous status, the known InferenceClasses, `now` and a provider;
//! out come the new status (deterministic: the same inputs give the same bytes, so the
//! controller writes only on change), when to be called again, and the acquisitions it holds
//! (with the nodes the controller may need to materialise). It checks what earlier steps
//! obtained (releasing what was interrupted or is now outside the allowed regions), then walks
//! capacity types × device-class fallback × allowed regions, cheapest offering first,
//! recording every provider attempt and remembering unavailable offerings with a cool-down.
//! `preview` lists, without acquiring anything, the offerings that walk would try.

mod disrupt;
mod duration;
mod memory;
pub mod preview;
mod report;
mod run;
pub mod search;

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_apis::claim::{CapacityClaimSpec, CapacityClaimStatus};
use flotilla_apis::class::InferenceClassSpec;
use k8s_openapi::jiff::Timestamp;

pub use disrupt::{
    CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED, ClaimUsage, KARPENTER_DO_NOT_DISRUPT, NodeUse, autoscaler_may_remove,
    drain_pending,
};
pub use duration::parse as parse_duration;
pub use memory::OfferingKey;
pub use preview::{NoTry, Try, preview};

use crate::provider::CapacityProvider;
use crate::types::Acquisition;

/// Tunables; the defaults follow Karpenter where it has one.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSettings {
    /// How long an offering that gave nothing is skipped after its first failure (3 min).
    pub unavailable_for: Duration,
    /// The longest cool-down after repeated failures (30 min).
    pub unavailable_cap: Duration,
    /// The longest back-off after throttling or outages (5 min).
    pub transient_cap: Duration,
    /// How often to look while nodes are provisioning (10 s).
    pub provisioning_poll: Duration,
    /// How often to look at a fulfilled or expired claim for interruptions (5 min).
    pub resync: Duration,
    /// Delay between noticing an interruption and re-acquiring (1 s).
    pub reacquire_after: Duration,
    /// Attempts kept in status, newest last (32).
    pub max_attempts: usize,
    /// Taint nodes with `flotilla.dev/claim=<namespace>.<name>:NoSchedule` so only the
    /// claim's workloads land there (on by default).
    pub taint_nodes: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            unavailable_for: Duration::from_secs(180),
            unavailable_cap: Duration::from_secs(1800),
            transient_cap: Duration::from_secs(300),
            provisioning_poll: Duration::from_secs(10),
            resync: Duration::from_secs(300),
            reacquire_after: Duration::from_secs(1),
            max_attempts: 32,
            taint_nodes: true,
        }
    }
}

/// What one step reads.
#[derive(Clone, Copy, Debug)]
pub struct ClaimInput<'a> {
    /// The claim's namespace.
    pub namespace: &'a str,
    /// The claim's name.
    pub name: &'a str,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `metadata.creationTimestamp`: `maxProvisioningLatency` counts from here (or from when
    /// the claim last stopped being fulfilled).
    pub created: Timestamp,
    /// The spec.
    pub spec: &'a CapacityClaimSpec,
    /// The status as last written (default when none).
    pub status: &'a CapacityClaimStatus,
    /// InferenceClasses by name.
    pub classes: &'a BTreeMap<String, InferenceClassSpec>,
    /// The claim's nodes and the pods on them, as the members show them (for giving surplus
    /// back under `spec.disruption`).
    pub usage: &'a ClaimUsage,
    /// Now.
    pub now: Timestamp,
}

/// What one step decided.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimStep {
    /// The new status.
    pub status: CapacityClaimStatus,
    /// Whether it differs from the input status (write only then).
    pub changed: bool,
    /// Call `step` again after this long (sooner when the claim changes).
    pub requeue_after: Duration,
    /// The acquisitions behind `status.allocations`, as the provider described them during
    /// this step; their `nodes` are what the controller materialises for `sim`.
    pub acquisitions: Vec<Acquisition>,
}

/// The engine: settings plus the CEL selector engine used to match offerings.
#[derive(Debug, Default)]
pub struct ClaimEngine {
    settings: EngineSettings,
    selectors: flotilla_apis::cel::SelectorEngine,
}

impl ClaimEngine {
    /// An engine with `settings`.
    pub fn new(settings: EngineSettings) -> Self {
        Self { settings, selectors: flotilla_apis::cel::SelectorEngine::new() }
    }

    /// The settings.
    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// One reconcile of a claim against `provider`. Never fails: provider errors end up in
    /// `status.attempts` and conditions, transient ones in a shorter `requeue_after`.
    pub async fn step(&self, input: ClaimInput<'_>, provider: &dyn CapacityProvider) -> ClaimStep {
        run::step(self, input, provider).await
    }

    /// For a claim being deleted: while `spec.disruption.scaleDown: ApplicationDrainOnly` says
    /// its capacity must wait for the application to leave, the status to write (`Surplus`=True,
    /// `DrainRequired`, naming the nodes) and when to look again; `None` once it may be released.
    pub fn hold_for_drain(&self, input: ClaimInput<'_>) -> Option<ClaimStep> {
        let message = drain_pending(input.spec, input.status, input.usage)?;
        let desired = [report::surplus(&[(flotilla_apis::constants::reason::DRAIN_REQUIRED, message)])];
        let mut status = input.status.clone();
        status.conditions = flotilla_apis::Conditions(flotilla_apis::conditions::merge(
            &input.status.conditions.0,
            &desired,
            input.generation,
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(input.now),
        ));
        Some(ClaimStep {
            changed: status != *input.status,
            status,
            requeue_after: self.settings.provisioning_poll,
            acquisitions: Vec::new(),
        })
    }

    /// Releases everything a claim holds (for the `flotilla.dev/capacity-release`
    /// finalizer): the allocations its status records plus whatever the provider says it
    /// holds for `claim` (`<namespace>.<name>`), which covers an acquisition made by a step
    /// whose status write never landed. Returns what could not be released yet, by id; a
    /// provider that cannot list what the claim holds is reported too (`held_by` as the id),
    /// so the finalizer retries instead of dropping the claim with capacity still held.
    pub async fn release_all(
        &self,
        claim: &str,
        status: &CapacityClaimStatus,
        provider: &dyn CapacityProvider,
    ) -> Vec<(String, crate::error::ProviderError)> {
        let regions = provider.regions();
        let mut failed = Vec::new();
        let mut targets: Vec<(String, String)> = Vec::new();
        for alloc in &status.allocations {
            if let Some(region) = regions.iter().find(|r| r.cluster == alloc.cluster) {
                targets.push((region.name.clone(), alloc.pool.clone()));
            }
        }
        match provider.held_by(claim).await {
            Ok(held) => targets.extend(held),
            Err(e) => failed.push(("held_by".to_string(), e)),
        }
        targets.sort();
        targets.dedup();
        for (region, id) in targets {
            if let Err(e) = provider.release(&region, &id).await {
                failed.push((id, e));
            }
        }
        failed
    }
}
