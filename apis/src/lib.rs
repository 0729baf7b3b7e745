//! Flotilla's API, group `flotilla.dev`, version `v1alpha1`: the six custom resources, their
//! status conditions and reasons, spec validation (the CRD schema's own rules plus what a
//! schema cannot check), and generation of the CRD YAML. No I/O and no async runtime: every
//! other crate reads the fleet through these types.

// kube-derive takes one `printcolumn(...)` per column; clippy mistakes the repeated keys for
// duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod autoscaling;
pub mod cache;
pub mod cel;
mod cel_rules;
pub mod claim;
pub mod class;
pub mod cluster;
pub mod common;
pub mod conditions;
pub mod constants;
pub mod crd;
#[cfg(feature = "crypto")]
pub mod crypto;
pub mod deployment;
pub mod document;
pub mod fnv;
pub mod names;
pub mod node_devices;
pub mod quantity;
pub mod quota;
pub mod reasons;
pub mod schema_check;
pub mod selector;
pub mod stage;
pub mod validate;
pub mod yaml_bound;

pub use cache::{ModelCache, ModelCacheSpec, ModelCacheStatus};
pub use claim::{CapacityClaim, CapacityClaimSpec, CapacityClaimStatus};
pub use class::{InferenceClass, InferenceClassSpec, InferenceClassStatus};
pub use cluster::{InferenceCluster, InferenceClusterSpec, InferenceClusterStatus};
pub use common::{CapacityType, Conditions};
pub use deployment::{ModelDeployment, ModelDeploymentSpec, ModelDeploymentStatus};
pub use document::{FleetObject, Located, SourceLocation};
pub use quota::{FleetQuota, FleetQuotaSpec, FleetQuotaStatus};
