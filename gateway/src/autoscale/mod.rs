//! Replicas that follow fleet-wide demand, and scale to zero. Demand flows in from the scrape
//! loop (`demand`); on the elected replica `writer` runs the pure decision (`recommend`) for
//! each ModelDeployment with `spec.autoscaling` and writes the count through the scale
//! subresource, `status.autoscaling` and an event on change. On every replica `activate`
//! holds requests for a model at zero replicas (within the caps of `queue`) and asks for one.
//! Metrics in `metrics`.

pub mod activate;
pub mod demand;
pub mod metrics;
pub mod queue;
pub mod recommend;
pub mod writer;

/// What the request path and the scrape loop share with the autoscaler.
#[derive(Debug, Default)]
pub struct Autoscale {
    /// Held requests and the wake-up on each routing-table swap.
    pub activation: activate::Activation,
    /// The engines' last figures per cluster and model.
    pub demand: demand::DemandBook,
}
