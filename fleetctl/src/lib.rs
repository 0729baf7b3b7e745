//! `fleetctl`, the Flotilla CLI, as a library: the command tree and every command, so that
//! tests can render tables and diffs from fixed objects. Offline it reads fleet YAML (files and
//! directories), validates it, prints the CRDs and shows where replicas would run and why;
//! against a control cluster it lists objects with their conditions (`get`) and plans or
//! explains the files laid over the live fleet (`plan --live`, `explain --live`).

pub mod adapters;
pub mod claims;
pub mod cli;
pub mod commands;
pub mod diff;
pub mod fieldline;
pub mod get;
pub mod live;
pub mod load;
pub mod overlay;
pub mod progress;
pub mod rejections;
pub mod render;
pub mod tables;
