//! `fleetctl plan -f` on a fleet file whose cluster states its usage node by node
//! (`status.pools[].nodeDevices`), as a reviewer would write it: 8 free devices split 4 + 4
//! over two nodes take no tensor-parallel-8 replica (exit 2, the reason says no node has 8
//! free), and the twin with the same totals on one node takes it (exit 0).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use std::path::PathBuf;
use std::process::{Command, Output};

const FLEET: &str = r#"
apiVersion: flotilla.dev/v1alpha1
kind: InferenceClass
metadata: {name: h100-sxm-80g}
spec:
  device:
    driver: gpu.nvidia.com
    attributes:
      productName: {string: "NVIDIA H100 80GB HBM3"}
    capacity: {memory: 80Gi}
  devicesPerNode: 8
  pricePerNodeHour: {onDemand: "98.32"}
---
apiVersion: flotilla.dev/v1alpha1
kind: InferenceCluster
metadata: {name: on-prem-1}
spec:
  provider: {static: {site: fra-dc2}}
  region: fra-dc2
  jurisdiction: EU
  credentials: {secretRef: {namespace: flotilla-system, name: on-prem-1-kubeconfig}}
  endpoint: https://inference.on-prem-1.example.com
  pools:
  - {name: h100, class: h100-sxm-80g, minNodes: 2, maxNodes: 2, nodes: 2, capacityTypes: [on-demand]}
status:
  pools:
  - name: h100
    class: h100-sxm-80g
    nodes: 2
    devicesTotal: 16
    devicesAllocated: 8
    devicesFree: 8
    nodeDevices: NODE_DEVICES
---
apiVersion: flotilla.dev/v1alpha1
kind: ModelDeployment
metadata: {name: llama-70b, namespace: ml}
spec:
  model: {name: llama-3.3-70b-instruct, source: "hf://meta-llama/Llama-3.3-70B-Instruct@main"}
  replicas: 1
  engine: {image: "vllm/vllm-openai:v0.11.0"}
  topology: {type: TensorParallel, devicesPerReplica: 8}
  devices:
    alternatives:
    - class: h100-sxm-80g
"#;

fn plan(case: &str, node_devices: &str) -> (Option<i32>, String, String) {
    let dir = std::env::temp_dir().join(format!("fleetctl-node-devices-{}-{case}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fleet.yaml");
    std::fs::write(&file, FLEET.replace("NODE_DEVICES", node_devices)).unwrap();
    let out: Output = Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .args(["plan", "-f", file.to_str().unwrap()])
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run fleetctl");
    std::fs::remove_dir_all(&dir).ok();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn eight_free_as_four_and_four_leave_the_tensor_parallel_8_replica_unplaced() {
    let (code, stdout, stderr) = plan("split", "[{free: 4, nodes: 2}]");
    assert_eq!(code, Some(2), "some replica unplaced\nstdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.lines().any(|l| l.contains("on-prem-1")
            && l.contains("InsufficientDevices")
            && l.contains("no node has 8 free (at most 4 on one node)")),
        "the reason names the split:\n{stdout}"
    );
}

#[test]
fn twin_the_same_eight_free_on_one_node_are_placed() {
    let (code, stdout, stderr) = plan("together", "[{free: 0, nodes: 1}, {free: 8, nodes: 1}]");
    assert_eq!(code, Some(0), "all placed\nstdout: {stdout}\nstderr: {stderr}");
    assert!(!stdout.contains("InsufficientDevices"), "{stdout}");
    assert!(!stdout.contains("UNPLACED"), "{stdout}");
}
