//! Nodes a simulated provider "provisioned", made real in the member cluster: each ready
//! `ProvisionedNode` becomes a kwok fake Node (labels, taints, GPU capacity) and a DRA
//! `ResourceSlice` publishing its devices the way the NVIDIA DRA driver would, so the member's
//! inventory, scheduler and Flotilla's placement see them like any other node (with the driver's
//! DeviceClass, which a real DRA driver installs, when the member lacks it). Nodes carry the
//! claim's label; what the claim no longer holds is deleted. Rendering is pure; `sync` applies.

use std::collections::{BTreeMap, BTreeSet};

use flotilla_apis::constants::labels;
use flotilla_providers::{Acquisition, AcquisitionState, ProvisionedNode};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

/// The Node for `node`, joining `pool` (the member's declared pool of the node's class).
pub fn node_object(node: &ProvisionedNode, region: &str, pool: &str) -> Value {
    let mut l: BTreeMap<String, String> = node.labels.clone();
    l.insert(labels::POOL.to_string(), pool.to_string());
    l.insert("type".into(), "kwok".into());
    l.insert("kubernetes.io/hostname".into(), node.name.clone());
    l.insert("kubernetes.io/os".into(), "linux".into());
    l.insert("kubernetes.io/arch".into(), "amd64".into());
    l.insert("topology.kubernetes.io/region".into(), region.to_string());
    l.insert("topology.kubernetes.io/zone".into(), node.zone.clone());
    l.insert("node.kubernetes.io/instance-type".into(), node.instance_type.clone());
    l.insert("karpenter.sh/capacity-type".into(), node.capacity_type.as_str().to_string());
    l.insert("nvidia.com/gpu.present".into(), "true".into());
    l.insert("nvidia.com/gpu.count".into(), node.devices.to_string());
    let taints: Vec<Value> = node
        .taints
        .iter()
        .map(|t| json!({"key": t.key, "value": t.value, "effect": format!("{:?}", t.effect)}))
        .collect();
    let resources = json!({"cpu": "96", "memory": "1024Gi", "ephemeral-storage": "1Ti", "pods": "110",
                           "nvidia.com/gpu": node.devices.to_string()});
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node.name, "labels": l,
                     "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"taints": taints},
        "status": {"capacity": resources, "allocatable": resources,
                   "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                                "kubeletVersion": "fake", "kubeProxyVersion": "fake"}}
    })
}

/// The ResourceSlice publishing `node`'s devices, owned by the Node (`uid`).
pub fn slice_object(node: &ProvisionedNode, pool: &str, uid: &str) -> Value {
    let devices: Vec<Value> = (0..node.devices)
        .map(|i| {
            let mut attributes = serde_json::Map::new();
            for (k, v) in &node.device.attributes {
                attributes.insert(k.clone(), serde_json::to_value(v).unwrap_or(Value::Null));
            }
            attributes.insert("index".into(), json!({"int": i}));
            attributes.insert("uuid".into(), json!({"string": format!("GPU-{}-{i}", node.name)}));
            let capacity: serde_json::Map<String, Value> =
                node.device.capacity.iter().map(|(k, q)| (k.clone(), json!({"value": q.0}))).collect();
            json!({"name": format!("gpu-{i}"), "attributes": attributes, "capacity": capacity})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{}-{}", node.name, node.device.driver),
                     "labels": {labels::POOL: pool, labels::CLAIM: node.labels.get(labels::CLAIM)},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": uid,
                                          "controller": true}]},
        "spec": {"driver": node.device.driver, "nodeName": node.name,
                 "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    })
}

/// The nodes that should exist for a claim: ready nodes of live acquisitions.
pub fn wanted(acquisitions: &[Acquisition]) -> Vec<&ProvisionedNode> {
    acquisitions
        .iter()
        .filter(|a| matches!(a.state, AcquisitionState::Active | AcquisitionState::Provisioning))
        .flat_map(|a| a.nodes.iter().filter(|n| n.ready))
        .collect()
}

/// Make a member's nodes for claim `claim` (`<namespace>.<name>`) exactly `nodes`; `pool_of`
/// gives the member pool for a class. Returns how many objects were written.
pub async fn sync(
    client: &Client,
    claim: &str,
    region: &str,
    nodes: &[&ProvisionedNode],
    pool_of: impl Fn(&str) -> Option<String>,
) -> Result<usize, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{}={claim}", labels::CLAIM));
    let existing: BTreeSet<String> = api.list(&lp).await?.items.iter().map(|n| n.name_any()).collect();
    let keep: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let mut writes = 0;
    // The DeviceClass a DRA driver installs with itself; a simulated node's driver is not there.
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let drivers: BTreeSet<&str> =
        nodes.iter().filter(|n| !existing.contains(&n.name)).map(|n| n.device.driver.as_str()).collect();
    for driver in drivers {
        let dc: DeviceClass = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]}}))
        .map_err(kube::Error::SerdeError)?;
        match classes.create(&PostParams::default(), &dc).await {
            Ok(_) => writes += 1,
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    for n in nodes.iter().filter(|n| !existing.contains(&n.name)) {
        let Some(pool) = pool_of(&n.class) else {
            tracing::warn!(node = %n.name, class = %n.class, "the member declares no pool of this class; node not created");
            continue;
        };
        let obj: Node = serde_json::from_value(node_object(n, region, &pool)).map_err(kube::Error::SerdeError)?;
        let created = api.create(&PostParams::default(), &obj).await?;
        let uid = created.metadata.uid.clone().unwrap_or_default();
        let slice: ResourceSlice =
            serde_json::from_value(slice_object(n, &pool, &uid)).map_err(kube::Error::SerdeError)?;
        match slices.create(&PostParams::default(), &slice).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e),
        }
        writes += 2;
    }
    for gone in existing.iter().filter(|n| !keep.contains(n.as_str())) {
        // The slice goes with its owner (garbage collection).
        match api.delete(gone, &DeleteParams::default()).await {
            Ok(_) => writes += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(writes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_apis::common::DeviceSpec;

    fn node() -> ProvisionedNode {
        let device: DeviceSpec = serde_json::from_value(json!({"driver": "gpu.nvidia.com",
            "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}}, "capacity": {"memory": "80Gi"}}))
        .unwrap();
        ProvisionedNode {
            name: "sim-eu-1a-0".into(),
            zone: "eu-west-3a".into(),
            instance_type: "p5.48xlarge".into(),
            capacity_type: flotilla_apis::CapacityType::OnDemand,
            class: "h100".into(),
            labels: BTreeMap::from([(labels::CLAIM.to_string(), "ml.llama".to_string())]),
            taints: vec![],
            device,
            devices: 2,
            ready: true,
        }
    }

    #[test]
    fn a_provisioned_node_renders_as_a_kwok_node_with_its_dra_slice() {
        let n = node();
        let obj = node_object(&n, "eu-west-3", "h100");
        assert_eq!(obj["metadata"]["labels"]["flotilla.dev/pool"], "h100");
        assert_eq!(obj["metadata"]["labels"]["flotilla.dev/claim"], "ml.llama");
        assert_eq!(obj["metadata"]["annotations"]["kwok.x-k8s.io/node"], "fake");
        assert_eq!(obj["status"]["allocatable"]["nvidia.com/gpu"], "2");
        let _: Node = serde_json::from_value(obj).unwrap();
        let slice = slice_object(&n, "h100", "uid-1");
        assert_eq!(slice["spec"]["devices"].as_array().unwrap().len(), 2);
        assert_eq!(slice["spec"]["devices"][1]["attributes"]["productName"]["string"], "NVIDIA H100 80GB HBM3");
        assert_eq!(slice["spec"]["devices"][0]["capacity"]["memory"]["value"], "80Gi");
        assert_eq!(slice["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        let _: ResourceSlice = serde_json::from_value(slice).unwrap();
    }
}
