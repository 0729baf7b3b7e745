//! The checks of an InferenceCluster against the set (`validate_set`): its provider's region,
//! its pools (names, classes, capacity types, reservations), how to reach it, and its observed
//! pools' per-node breakdowns.

use std::collections::{BTreeMap, BTreeSet};

use super::{Set, Sink, has_duplicates};
use crate::cluster::{InferenceCluster, InferenceClusterSpec};
use crate::common::CapacityType;

/// Every check of one InferenceCluster (the sink's current object).
pub(super) fn check_cluster(sink: &mut Sink<'_>, c: &InferenceCluster, set: &Set<'_>) {
    let s = &c.spec;
    if let Some(aws) = &s.provider.aws
        && aws.region != s.region
    {
        sink.error(
            "spec.provider.aws.region",
            format!("{} differs from spec.region {}: they must name the same region", aws.region, s.region),
        );
    }
    check_pools(sink, s, set);
    if s.endpoint.is_none() {
        sink.warn("spec.endpoint", "no entry URL: the gateway cannot route requests to this cluster");
    }
    if s.credentials.is_none() && s.cluster_profile_ref.is_none() {
        sink.warn(
            "spec.credentials",
            "neither credentials nor clusterProfileRef: the controller cannot reach this member",
        );
    }
    check_observed_pools(sink, c, &set.per_node);
}

/// The declared pools: unique names, known classes, capacity types listed once, and
/// reservations that match the capacity types.
fn check_pools(sink: &mut Sink<'_>, s: &InferenceClusterSpec, set: &Set<'_>) {
    let mut pools = BTreeSet::new();
    for (i, p) in s.pools.iter().enumerate() {
        if !pools.insert(p.name.as_str()) {
            sink.error(format!("spec.pools[{i}].name"), format!("duplicate pool name {:?} in this cluster", p.name));
        }
        if !set.known_class(&p.class) {
            sink.error(format!("spec.pools[{i}].class"), set.unknown_class(&p.class));
        }
        if has_duplicates(&p.capacity_types) {
            sink.error(format!("spec.pools[{i}].capacityTypes"), "lists a capacity type twice");
        }
        if !p.reservation_ids.is_empty() && !p.capacity_types.contains(&CapacityType::Reserved) {
            sink.warn(
                format!("spec.pools[{i}].reservationIds"),
                "reservations are named but capacityTypes does not include reserved",
            );
        }
        if p.capacity_types.contains(&CapacityType::Reserved)
            && p.reservation_ids.is_empty()
            && s.provider.aws.is_some()
        {
            sink.warn(
                format!("spec.pools[{i}].reservationIds"),
                "offers reserved capacity on AWS but names no reservation",
            );
        }
    }
}

/// The observed pools (`status.pools`) and their claims' nodes (`reserved`): each per-node
/// breakdown adds up and fits its class.
fn check_observed_pools(sink: &mut Sink<'_>, c: &InferenceCluster, per_node: &BTreeMap<&str, u32>) {
    for (i, o) in c.status.iter().flat_map(|st| st.pools.iter()).enumerate() {
        let field = format!("status.pools[{i}]");
        let per_node = per_node.get(o.class.as_str()).copied();
        let totals = [o.nodes.into(), o.devices_free, o.devices_managed];
        check_node_devices(sink, &field, &o.node_devices, totals, per_node);
        for (j, r) in o.reserved.iter().enumerate() {
            let totals = [r.nodes.into(), r.devices_total - r.devices_allocated, r.devices_managed];
            check_node_devices(sink, &format!("{field}.reserved[{j}]"), &r.node_devices, totals, per_node);
        }
    }
}

/// A pool's per-node breakdown (`nodeDevices`) adds up to its totals `[nodes, free, managed]`
/// and no node holds more devices than its class has.
fn check_node_devices(
    sink: &mut Sink<'_>,
    field: &str,
    bars: &[crate::cluster::NodeDevices],
    [nodes, free, managed]: [i64; 3],
    per_node: Option<u32>,
) {
    let free_field = if field.contains(".reserved[") { "devicesTotal - devicesAllocated" } else { "devicesFree" };
    for message in crate::cluster::node_devices_problems(
        bars,
        (&format!("{field}.nodes"), nodes),
        (&format!("{field}.{free_field}"), free),
        (&format!("{field}.devicesManaged"), managed),
    ) {
        sink.error(format!("{field}.nodeDevices"), message);
    }
    let Some(per_node) = per_node else { return };
    for (j, b) in bars.iter().enumerate() {
        if i64::from(b.free) + i64::from(b.managed) > i64::from(per_node) {
            sink.error(
                format!("{field}.nodeDevices[{j}]"),
                format!(
                    "free {} + managed {} devices on one node, but its class has {per_node} per node: lower them",
                    b.free, b.managed
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{CLASS, CLUSTER, fields, parse, reported};
    use super::*;
    use crate::cel::SelectorEngine;
    use crate::document::{FleetObject, Located};

    /// The problems `check` reports on the cluster of `cluster` (with the H100 class in the set).
    fn on_cluster(cluster: &str, check: impl Fn(&mut Sink<'_>, &InferenceCluster, &Set<'_>)) -> Vec<String> {
        let objects = parse(&[CLASS, cluster]);
        let engine = SelectorEngine::new();
        let classes = super::super::describe_classes(&mut Sink { problems: vec![], current: None }, &objects, &engine);
        let set = Set::of(&objects, &[], &classes);
        let obj: &Located<FleetObject> = &objects[1];
        let FleetObject::Cluster(c) = &obj.value else { panic!("not a cluster") };
        fields(&reported(obj, |sink| check(sink, c, &set))).into_iter().map(String::from).collect()
    }

    #[test]
    fn a_cluster_names_one_region_and_how_to_reach_it() {
        assert!(on_cluster(CLUSTER, check_cluster).is_empty());
        let elsewhere = CLUSTER.replace("region: eu-central-1}", "region: eu-west-1}");
        assert_eq!(on_cluster(&elsewhere, check_cluster), vec!["spec.provider.aws.region"]);
        let unreachable = CLUSTER
            .replace("  credentials: {secretRef: {namespace: flotilla-system, name: eu-fra-1-kubeconfig}}\n", "")
            .replace("  endpoint: https://inference.eu-fra-1.example.com\n", "");
        assert_eq!(on_cluster(&unreachable, check_cluster), vec!["spec.endpoint", "spec.credentials"]);
    }

    #[test]
    fn pools_are_named_once_of_known_classes_with_reservations_that_fit() {
        let pools = CLUSTER.replace(
            "  - {name: h100, class: h100, minNodes: 0, maxNodes: 4, nodes: 2, capacityTypes: [on-demand]}",
            "  - {name: h100, class: h100, minNodes: 0, maxNodes: 4, nodes: 2, capacityTypes: [on-demand, on-demand]}\n  \
             - {name: h100, class: a100, minNodes: 0, maxNodes: 4, capacityTypes: [reserved]}\n  \
             - {name: named, class: h100, minNodes: 0, maxNodes: 4, capacityTypes: [on-demand], reservationIds: [cr-1]}",
        );
        assert_eq!(
            on_cluster(&pools, |sink, c, set| check_pools(sink, &c.spec, set)),
            vec![
                "spec.pools[0].capacityTypes",
                "spec.pools[1].name",
                "spec.pools[1].class",
                "spec.pools[1].reservationIds",
                "spec.pools[2].reservationIds",
            ]
        );
    }

    #[test]
    fn an_observed_breakdown_adds_up_and_fits_its_class() {
        let observed =
            |sink: &mut Sink<'_>, c: &InferenceCluster, set: &Set<'_>| check_observed_pools(sink, c, &set.per_node);
        let status = |bars: &str, free: i64| {
            format!(
                "{CLUSTER}status:\n  pools:\n  - {{name: h100, class: h100, nodes: 2, devicesTotal: 16, devicesAllocated: {}, devicesFree: {free}, nodeDevices: [{bars}]}}\n",
                16 - free
            )
        };
        assert!(on_cluster(&status("{free: 8, nodes: 2}", 16), observed).is_empty());
        assert_eq!(on_cluster(&status("{free: 8, nodes: 2}", 8), observed), vec!["status.pools[0].nodeDevices"]);
        let over = status("{free: 12, nodes: 1}, {free: 4, nodes: 1}", 16);
        assert_eq!(on_cluster(&over, observed), vec!["status.pools[0].nodeDevices[0]"]);
    }
}
