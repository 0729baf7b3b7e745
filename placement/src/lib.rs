//! The placement solver: a pure function from a fleet snapshot to a plan where every
//! ModelDeployment replica runs, with a machine-readable reason for every cluster that was
//! rejected. No I/O, no clock, no global state: the same snapshot gives the same plan.

pub mod claim;
pub mod crowded;
pub mod devices;
pub mod filters;
pub mod generate;
pub mod isolate;
pub mod plan;
mod reason_doc;
pub mod snapshot;
mod solve;

pub use plan::{
    Assignment, DeploymentPlan, GaveUp, InvalidSpec, Move, Plan, Preemption, Reason, Rejection, TierTrade, Trade,
};
pub use snapshot::{ClassView, ClusterView, DeploymentView, FleetSnapshot, PoolView, QuotaView, cache_key};
pub use solve::quota::{LimitUsage, QuotaUsage, usage as quota_usage};
pub use solve::{ExactOptions, ExactReport, ReplanStats, Replanner, SolveOptions, exact, problem, solve};
