//! Capacity providers: the `CapacityProvider` trait and its adapters (AWS EKS/EC2, static
//! inventory, simulated clouds) that obtain accelerator nodes, and the claim engine that
//! turns a `CapacityClaim` spec plus its previous status into provider calls and a new status.
//! The AWS adapter is behind the `aws` feature (on by default).

#[cfg(feature = "aws")]
pub mod aws;
pub mod claim;
pub mod clock;
pub mod error;
pub mod fixed;
pub mod provider;
pub mod set;
pub mod sim;
pub mod types;

pub use claim::{ClaimEngine, ClaimInput, ClaimStep, ClaimUsage, EngineSettings, NodeUse};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{ErrorKind, ProviderError};
pub use fixed::StaticProvider;
pub use provider::CapacityProvider;
pub use set::ProviderSet;
pub use sim::{SimCloud, SimOffering, SimProvider, SimRegion};
pub use types::{
    AcquireRequest, Acquisition, AcquisitionState, CapacityEvent, CapacityEventKind, NamedNode, NodeRemoval, NodeTaint,
    Offering, ProvisionedNode, RegionInfo,
};
