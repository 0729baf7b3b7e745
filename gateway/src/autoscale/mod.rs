//! Replicas that follow fleet-wide demand. Demand per model is read from the engines' metrics
//! pages (`demand`); `recommend` is the pure decision from a deployment's `spec.autoscaling`
//! and that demand.

pub mod demand;
pub mod recommend;
