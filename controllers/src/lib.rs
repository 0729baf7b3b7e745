//! The reconcilers: one per Flotilla kind on `kube::runtime::Controller`, member-cluster clients, rendering of member workloads, status writing and leader election.
