//! Which CapacityClaim a ModelDeployment should own. The decision is a pure function of the
//! deployment and its plan, so it lives in the placement crate, where `fleetctl plan` can
//! preview it without a cluster; the deployment reconciler applies it.

pub use flotilla_placement::claim::{ClaimDecision, decide};
