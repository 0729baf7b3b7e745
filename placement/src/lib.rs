//! The placement solver: a pure function from a fleet snapshot to a plan where every ModelDeployment replica runs, with a machine-readable reason for every cluster that was rejected.
