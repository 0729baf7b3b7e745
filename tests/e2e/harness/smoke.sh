#!/usr/bin/env bash
# End-to-end check of the harness itself: build (cached), start a control
# cluster and two members, add fake GPU nodes, and check that
#   - every apiserver's /version is exactly FLOTILLA_K8S_VERSION
#   - every apiserver serves resource.k8s.io/v1 resourceslices (DRA)
#   - nodes and ResourceSlices are there, with the expected labels and devices
#   - a pod asking for 8 nvidia.com/gpu is scheduled onto an H100 node and Running
#   - a pod asking for more GPUs than any node has stays Pending (Unschedulable)
#   - a pod with a DRA ResourceClaim for an L40S with >= 40Gi is allocated a
#     device from the L40S node's ResourceSlice and Running
# then tear everything down. Exits non-zero on any failure.
#
# Environment: FLOTILLA_E2E_DIR (default: a fresh temporary dir, removed at the
# end), FLOTILLA_E2E_KEEP=1 to leave the clusters running for inspection.
set -euo pipefail
user_dir="${FLOTILLA_E2E_DIR:-}"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

own_dir=0
if [[ -z "${user_dir}" ]]; then
  FLOTILLA_E2E_DIR="$(mktemp -d "${TMPDIR:-/tmp}/flotilla-smoke.XXXXXX")"
  own_dir=1
fi
export FLOTILLA_E2E_DIR
clusters=(control member-a member-b)
t0=$(date +%s)
failure=""
# Remember why we failed, to repeat it after the (long) component log dump.
die() { failure="$*"; printf '[%s] ERROR: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }

cleanup() {
  local rc=$?
  if [[ "${FLOTILLA_E2E_KEEP:-0}" == 1 ]]; then
    log "FLOTILLA_E2E_KEEP=1: clusters left running; kubeconfigs in ${FLOTILLA_E2E_DIR}"
    exit "${rc}"
  fi
  if [[ ${rc} -ne 0 ]]; then
    log "FAILED (exit ${rc}); component logs:"
    local f
    for f in "${FLOTILLA_E2E_DIR}"/kwok/clusters/*/logs/*.log; do
      [[ -f "${f}" ]] || continue
      echo "----- ${f} (last 20 lines)" >&2
      tail -n 15 "${f}" >&2
    done
  fi
  "${HARNESS_DIR}/down.sh" "${clusters[@]}" || rc=1
  [[ ${own_dir} -eq 1 ]] && rm -rf "${FLOTILLA_E2E_DIR}"
  log "smoke: $([[ ${rc} -eq 0 ]] && echo PASS || echo "FAIL${failure:+: ${failure}}") in $(( $(date +%s) - t0 ))s"
  exit "${rc}"
}
trap cleanup EXIT

step() { log "== $*"; }
check() { # check DESCRIPTION ACTUAL EXPECTED
  [[ "$2" == "$3" ]] || die "$1: got '$2', expected '$3'"
  log "ok: $1 = $3"
}

step "build"
s=$(date +%s); "${HARNESS_DIR}/build.sh" >/dev/null; log "build.sh took $(( $(date +%s) - s ))s"

step "up ${clusters[*]}"
s=$(date +%s); "${HARNESS_DIR}/up.sh" "${clusters[@]}"; log "up.sh took $(( $(date +%s) - s ))s"
kc() { echo "${FLOTILLA_E2E_DIR}/$1.kubeconfig"; }

step "versions and APIs"
for c in "${clusters[@]}"; do
  v=$(kubectl --kubeconfig "$(kc "${c}")" get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
  check "${c} /version gitVersion" "${v}" "${FLOTILLA_K8S_VERSION}"
  r=$(kubectl --kubeconfig "$(kc "${c}")" api-resources --api-group=resource.k8s.io -o name | grep -c '^resourceslices\.resource\.k8s\.io$' || true)
  check "${c} serves resourceslices.resource.k8s.io" "${r}" 1
  gv=$(kubectl --kubeconfig "$(kc "${c}")" get --raw /apis/resource.k8s.io | grep -o '"preferredVersion":{[^}]*}' | grep -o '"version":"[^"]*"')
  check "${c} resource.k8s.io preferred version" "${gv}" '"version":"v1"'
done

step "GPU nodes"
s=$(date +%s)
"${HARNESS_DIR}/gpu-nodes.sh" "$(kc member-a)" h100 --count 2 --region us-east-1
"${HARNESS_DIR}/gpu-nodes.sh" "$(kc member-b)" l40s --count 1 --region eu-west-1 --zone eu-west-1b
"${HARNESS_DIR}/gpu-nodes.sh" "$(kc member-b)" a100 --count 1 --region eu-west-1 --zone eu-west-1b --capacity-type spot
log "gpu-nodes.sh x3 took $(( $(date +%s) - s ))s"
for c in member-a member-b; do
  kubectl --kubeconfig "$(kc "${c}")" get nodes -L flotilla.dev/pool,node.kubernetes.io/instance-type,topology.kubernetes.io/zone
  kubectl --kubeconfig "$(kc "${c}")" get resourceslices
done
check "member-a Ready nodes" "$(kubectl --kubeconfig "$(kc member-a)" get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)" 2
check "member-b Ready nodes" "$(kubectl --kubeconfig "$(kc member-b)" get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)" 2
check "control nodes" "$(kubectl --kubeconfig "$(kc control)" get nodes -o name | wc -l)" 0
check "h100-0 allocatable nvidia.com/gpu" "$(kubectl --kubeconfig "$(kc member-a)" get node h100-0 -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" 8
check "h100-1 zone" "$(kubectl --kubeconfig "$(kc member-a)" get node h100-1 -o jsonpath='{.metadata.labels.topology\.kubernetes\.io/zone}')" us-east-1a
check "member-a ResourceSlices" "$(kubectl --kubeconfig "$(kc member-a)" get resourceslices -o name | wc -l)" 2
check "h100-0 slice devices" "$(kubectl --kubeconfig "$(kc member-a)" get resourceslice h100-0-gpu.nvidia.com -o jsonpath='{range .spec.devices[*]}{.name}{"\n"}{end}' | wc -l)" 8
check "h100-0 gpu-3 productName" "$(kubectl --kubeconfig "$(kc member-a)" get resourceslice h100-0-gpu.nvidia.com -o jsonpath='{.spec.devices[3].attributes.productName.string}')" "NVIDIA H100 80GB HBM3"
check "l40s-0 gpu-0 memory" "$(kubectl --kubeconfig "$(kc member-b)" get resourceslice l40s-0-gpu.nvidia.com -o jsonpath='{.spec.devices[0].capacity.memory.value}')" 48Gi
# Idempotent: a second run changes nothing and does not fail.
"${HARNESS_DIR}/gpu-nodes.sh" "$(kc member-a)" h100 --count 2 --region us-east-1
check "member-a nodes after re-run" "$(kubectl --kubeconfig "$(kc member-a)" get nodes -o name | wc -l)" 2

step "GPU pod (device plugin resource) on member-a"
kubectl --kubeconfig "$(kc member-a)" apply -f - <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: gpu-8
spec:
  nodeSelector:
    flotilla.dev/pool: h100
  containers:
  - name: vllm
    image: vllm/vllm-openai:latest
    resources:
      limits:
        nvidia.com/gpu: "8"
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-too-many
spec:
  containers:
  - name: vllm
    image: vllm/vllm-openai:latest
    resources:
      limits:
        nvidia.com/gpu: "9"
YAML
kubectl --kubeconfig "$(kc member-a)" wait --for=jsonpath='{.status.phase}'=Running pod/gpu-8 --timeout=120s
node=$(kubectl --kubeconfig "$(kc member-a)" get pod gpu-8 -o jsonpath='{.spec.nodeName}')
[[ "${node}" == h100-* ]] || die "gpu-8 ran on '${node}', expected an h100 node"
log "ok: gpu-8 Running on ${node}"
kubectl --kubeconfig "$(kc member-a)" wait --for=jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}'=Unschedulable pod/gpu-too-many --timeout=60s
check "gpu-too-many phase" "$(kubectl --kubeconfig "$(kc member-a)" get pod gpu-too-many -o jsonpath='{.status.phase}')" Pending

step "DRA ResourceClaim pod on member-b"
kubectl --kubeconfig "$(kc member-b)" apply -f - <<'YAML'
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: one-l40s
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        count: 1
        selectors:
        - cel:
            expression: >-
              device.attributes["gpu.nvidia.com"].productName == "NVIDIA L40S" &&
              device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0 &&
              device.attributes["gpu.nvidia.com"].computeCapability.isGreaterThan(semver("8.0.0"))
---
apiVersion: v1
kind: Pod
metadata:
  name: dra-l40s
spec:
  resourceClaims:
  - name: gpu
    resourceClaimName: one-l40s
  containers:
  - name: vllm
    image: vllm/vllm-openai:latest
    resources:
      claims:
      - name: gpu
YAML
kubectl --kubeconfig "$(kc member-b)" wait --for=jsonpath='{.status.phase}'=Running pod/dra-l40s --timeout=120s
check "dra-l40s node" "$(kubectl --kubeconfig "$(kc member-b)" get pod dra-l40s -o jsonpath='{.spec.nodeName}')" l40s-0
check "one-l40s allocated pool" "$(kubectl --kubeconfig "$(kc member-b)" get resourceclaim one-l40s -o jsonpath='{.status.allocation.devices.results[0].pool}')" l40s-0
check "one-l40s allocated driver" "$(kubectl --kubeconfig "$(kc member-b)" get resourceclaim one-l40s -o jsonpath='{.status.allocation.devices.results[0].driver}')" gpu.nvidia.com

step "nothing was downloaded"
# kwokctl puts anything it fetches under its cache dir; the binary runtime
# must have used only the binaries build.sh made.
[[ ! -e "${FLOTILLA_E2E_DIR}/kwok/cache" ]] || die "kwokctl downloaded something: $(find "${FLOTILLA_E2E_DIR}/kwok/cache" -type f | head -n5)"
for c in "${clusters[@]}"; do
  for b in "${FLOTILLA_E2E_DIR}/kwok/clusters/${c}"/bin/*; do
    [[ "$(readlink -f "${b}")" == "${FLOTILLA_BIN_DIR}/"* ]] || die "${b} is not one of ours"
  done
done
log "ok: no kwokctl cache; every component binary is from ${FLOTILLA_BIN_DIR}"

step "all checks passed"
