//! `--sim-cloud FILE`: the simulated cloud's YAML. The format and its parser live in the
//! providers crate (`sim::file`), where `fleetctl plan --cloud` reads the same file.

pub use flotilla_providers::sim::file::{OfferingFile, RegionFile, SimCloudFile, load};
