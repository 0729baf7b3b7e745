#!/usr/bin/env bash
# Create fake GPU nodes, run by kwok, in a cluster started by up.sh:
#   gpu-nodes.sh KUBECONFIG PROFILE [--count N] [--pool NAME] [--region R] [--zone Z]
#                                  [--capacity-type on-demand|spot|reserved]
# PROFILE (an AWS instance type with its GPUs):
#   h100  p5.48xlarge    8 x NVIDIA H100 80GB HBM3   (Hopper, cc 9.0, 80Gi)
#   a100  p4de.24xlarge  8 x NVIDIA A100-SXM4-80GB   (Ampere, cc 8.0, 80Gi)
#   l40s  g6e.12xlarge   4 x NVIDIA L40S             (Ada Lovelace, cc 8.9, 48Gi)
# Defaults: --count 2, --pool PROFILE, --region us-east-1, --zone REGIONa,
# --capacity-type on-demand. Nodes are named POOL-0 .. POOL-(N-1).
#
# Each node gets:
#   labels      topology.kubernetes.io/{region,zone}, node.kubernetes.io/instance-type,
#               flotilla.dev/pool, karpenter.sh/capacity-type, nvidia.com/gpu.{product,count,memory}
#   capacity    cpu, memory, pods, nvidia.com/gpu (device-plugin style)
#   annotation  kwok.x-k8s.io/node=fake, so the kwok controller keeps it Ready
#               and runs its pods
# plus one DRA ResourceSlice (resource.k8s.io/v1, driver gpu.nvidia.com, pool =
# node name, owned by the Node) with one device per GPU:
#   attributes  productName, architecture, brand, type (string), index (int),
#               uuid (string), computeCapability, driverVersion, cudaDriverVersion (version)
#   capacity    memory
# and a cluster-wide DeviceClass gpu.nvidia.com selecting that driver.
# Idempotent: re-running with the same arguments changes nothing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 2 ]] || usage
kc="$1" profile="$2"
shift 2
[[ -f "${kc}" ]] || die "kubeconfig ${kc} does not exist"
count=2 pool="${profile}" region="us-east-1" zone="" capacity_type="on-demand"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --count) count="$2"; shift 2 ;;
    --pool) pool="$2"; shift 2 ;;
    --region) region="$2"; shift 2 ;;
    --zone) zone="$2"; shift 2 ;;
    --capacity-type) capacity_type="$2"; shift 2 ;;
    *) usage ;;
  esac
done
zone="${zone:-${region}a}"
[[ "${count}" =~ ^[0-9]+$ ]] || die "--count must be a number"
[[ "${pool}" =~ ^[a-z0-9]([a-z0-9-]*[a-z0-9])?$ ]] || die "--pool '${pool}' must be a DNS label"

case "${profile}" in
  h100) instance=p5.48xlarge   gpus=8 product="NVIDIA H100 80GB HBM3" arch=Hopper cc=9.0.0 \
        gpu_mem=80Gi gpu_mem_mib=81559 cpu=192 mem=2048Gi ;;
  a100) instance=p4de.24xlarge gpus=8 product="NVIDIA A100-SXM4-80GB" arch=Ampere cc=8.0.0 \
        gpu_mem=80Gi gpu_mem_mib=81920 cpu=96 mem=1152Gi ;;
  l40s) instance=g6e.12xlarge  gpus=4 product="NVIDIA L40S" arch="Ada Lovelace" cc=8.9.0 \
        gpu_mem=48Gi gpu_mem_mib=46068 cpu=48 mem=384Gi ;;
  *) die "unknown profile '${profile}' (h100, a100, l40s)" ;;
esac
driver_version=570.133.20 cuda_version=12.8.0

k() { kubectl --kubeconfig "${kc}" "$@"; }

nodes_yaml() {
  local i name
  for ((i = 0; i < count; i++)); do
    name="${pool}-${i}"
    cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: ${name}
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: ${name}
    node.kubernetes.io/instance-type: ${instance}
    topology.kubernetes.io/region: ${region}
    topology.kubernetes.io/zone: ${zone}
    karpenter.sh/capacity-type: ${capacity_type}
    flotilla.dev/pool: ${pool}
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: ${product// /-}
    nvidia.com/gpu.count: "${gpus}"
    nvidia.com/gpu.memory: "${gpu_mem_mib}"
spec: {}
status:
  capacity: &resources
    cpu: "${cpu}"
    memory: ${mem}
    ephemeral-storage: 1Ti
    pods: "110"
    nvidia.com/gpu: "${gpus}"
  allocatable: *resources
  nodeInfo:
    architecture: amd64
    operatingSystem: linux
    kubeletVersion: fake
    kubeProxyVersion: fake
YAML
  done
}

slices_yaml() {
  local name uid g
  while read -r name uid; do
    cat <<YAML
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: ${name}-gpu.nvidia.com
  labels:
    flotilla.dev/pool: ${pool}
  ownerReferences:
  - apiVersion: v1
    kind: Node
    name: ${name}
    uid: ${uid}
    controller: true
spec:
  driver: gpu.nvidia.com
  nodeName: ${name}
  pool:
    name: ${name}
    generation: 1
    resourceSliceCount: 1
  devices:
YAML
    for ((g = 0; g < gpus; g++)); do
      cat <<YAML
  - name: gpu-${g}
    attributes:
      type: {string: gpu}
      brand: {string: Nvidia}
      productName: {string: "${product}"}
      architecture: {string: "${arch}"}
      computeCapability: {version: "${cc}"}
      driverVersion: {version: "${driver_version}"}
      cudaDriverVersion: {version: "${cuda_version}"}
      index: {int: ${g}}
      uuid: {string: "GPU-$(printf '%08x' "$(cksum <<<"${name}" | cut -d' ' -f1)")-0000-0000-0000-$(printf '%012d' "${g}")"}
    capacity:
      memory: {value: ${gpu_mem}}
YAML
    done
  done
}

log "$(basename "${kc}"): ${count} x ${profile} (${instance}, ${gpus} GPUs) in pool ${pool}, ${zone}"
k apply -f - >/dev/null <<YAML
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.nvidia.com"
YAML
[[ ${count} -gt 0 ]] || exit 0
nodes_yaml | k apply -f - >/dev/null
k get nodes -l "flotilla.dev/pool=${pool}" \
  -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.uid}{"\n"}{end}' \
  | slices_yaml | k apply -f - >/dev/null
k wait --for=condition=Ready node -l "flotilla.dev/pool=${pool}" --timeout=120s >/dev/null
log "$(basename "${kc}"): pool ${pool} ready: $(k get nodes -l "flotilla.dev/pool=${pool}" -o name | wc -l) nodes, $(k get resourceslices -l "flotilla.dev/pool=${pool}" -o name | wc -l) ResourceSlices"
