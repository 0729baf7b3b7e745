//! A pool's observed capacity node by node, kept compact: ready nodes grouped by the devices
//! free on each and the devices Flotilla's replicas hold on each (`PoolStatus.nodeDevices`).
//! The inventory groups what it counted per node into it ([`node_devices`]); the solver reads
//! it back as free devices per node; validation checks that it adds up to the totals beside it
//! ([`node_devices_problems`]).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Ready nodes with the same devices free and the same devices held by Flotilla's replicas:
/// one bar of a histogram, so that a pool of a thousand alike nodes stays a few entries. The
/// devices a replica may use on such a node are `free + managed` (the solver places Flotilla's
/// replicas anew); a replica whose pods need N devices on one node fits only where that is at
/// least N. Sorted by `free`, then `managed`; each pair appears once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDevices {
    /// Devices on each of these nodes that no pod or ResourceClaim holds.
    #[schemars(range(min = 0, max = 1024))]
    pub free: i32,
    /// Devices on each of these nodes held by replicas Flotilla manages.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1024))]
    pub managed: i32,
    /// How many ready nodes have these figures.
    #[schemars(range(min = 1, max = 10000))]
    pub nodes: i32,
}

/// How many entries `PoolStatus.nodeDevices` and `ReservedCapacity.nodeDevices` hold at most
/// (the CRD's `maxItems`).
pub const NODE_DEVICES_MAX: usize = 128;

/// Groups per-node figures — `(free, managed)` for each ready node — into the sorted,
/// one-entry-per-pair histogram of `PoolStatus.nodeDevices`. Empty (the field left out, the
/// solver falls back to whole nodes) when it would not pass the CRD's bounds: more distinct
/// pairs than [`NODE_DEVICES_MAX`], more than 1,024 devices on a node, more than 10,000 nodes.
pub fn node_devices(per_node: impl IntoIterator<Item = (i32, i32)>) -> Vec<NodeDevices> {
    let mut bars: BTreeMap<(i32, i32), i32> = BTreeMap::new();
    for (free, managed) in per_node {
        *bars.entry((free.max(0), managed.max(0))).or_default() += 1;
    }
    let fits = bars.len() <= NODE_DEVICES_MAX
        && bars.iter().all(|(&(free, managed), &nodes)| free <= 1024 && managed <= 1024 && nodes <= 10_000);
    if !fits {
        return Vec::new();
    }
    bars.into_iter().map(|((free, managed), nodes)| NodeDevices { free, managed, nodes }).collect()
}

/// Where a per-node breakdown disagrees with the totals beside it, one message per total
/// (empty when it agrees or is absent). `nodes`, `free` and `managed` are the totals it must
/// add up to, each with the name of its field.
pub fn node_devices_problems(
    bars: &[NodeDevices],
    nodes: (&str, i64),
    free: (&str, i64),
    managed: (&str, i64),
) -> Vec<String> {
    if bars.is_empty() {
        return Vec::new();
    }
    let sum = |per_node: fn(&NodeDevices) -> i32| -> i64 {
        bars.iter().map(|b| i64::from(per_node(b)) * i64::from(b.nodes)).sum()
    };
    [
        ("nodes", sum(|_| 1), nodes),
        ("free × nodes", sum(|b| b.free), free),
        ("managed × nodes", sum(|b| b.managed), managed),
    ]
    .into_iter()
    .filter(|(_, have, (_, want))| have != want)
    .map(|(what, have, (field, want))| {
        format!("its {what} add up to {have}, but {field} is {want}: make them agree, or leave nodeDevices out")
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::{NODE_DEVICES_MAX, NodeDevices, node_devices, node_devices_problems};

    fn bar(free: i32, managed: i32, nodes: i32) -> NodeDevices {
        NodeDevices { free, managed, nodes }
    }

    #[test]
    fn a_thousand_alike_nodes_are_one_entry_and_pairs_are_sorted() {
        let mut nodes = vec![(8, 0); 1000];
        nodes.extend([(4, 4), (0, 0), (4, 0), (4, 0)]);
        assert_eq!(node_devices(nodes), [bar(0, 0, 1), bar(4, 0, 2), bar(4, 4, 1), bar(8, 0, 1000)]);
    }

    #[test]
    fn too_many_shapes_leave_the_breakdown_out() {
        let shapes: Vec<(i32, i32)> = (0..=NODE_DEVICES_MAX as i32).map(|f| (f, 0)).collect();
        assert!(node_devices(shapes.clone()).is_empty(), "{} shapes do not fit", shapes.len());
        assert_eq!(node_devices(shapes[1..].to_vec()).len(), NODE_DEVICES_MAX, "twin: one fewer fits");
        assert!(node_devices([(1025, 0)]).is_empty(), "more devices on a node than the schema allows");
    }

    #[test]
    fn a_breakdown_must_add_up_to_the_totals_it_breaks_down() {
        let bars = [bar(4, 0, 2), bar(0, 8, 1)];
        let ok = node_devices_problems(&bars, ("nodes", 3), ("devicesFree", 8), ("devicesManaged", 8));
        assert!(ok.is_empty(), "{ok:?}");
        let bad = node_devices_problems(&bars, ("nodes", 2), ("devicesFree", 8), ("devicesManaged", 4));
        assert_eq!(
            bad,
            [
                "its nodes add up to 3, but nodes is 2: make them agree, or leave nodeDevices out",
                "its managed × nodes add up to 8, but devicesManaged is 4: make them agree, or leave nodeDevices out",
            ]
        );
        assert!(node_devices_problems(&[], ("nodes", 2), ("f", 1), ("m", 1)).is_empty(), "absent: nothing to add up");
    }
}
