#!/usr/bin/env bash
# Captures the real status objects the Argo CD health tests use (tests/argocd/fixtures/*.json):
# a control cluster and two members (tests/e2e/harness; kwok GPU nodes), the flotilla-controller
# binary reconciling them, and `kubectl get -o json` of each object once it shows the state a
# fixture is named after. Not part of the test run (the fixtures are committed); re-run it when
# the controller's status changes shape:
#   bash tests/argocd/capture-fixtures.sh        (about a minute; needs target/debug/flotilla-controller)
#
# States that need a member whose pods never become ready (a rollout in flight, a move, a
# partial scale-up) are made by stopping that member's kwok controller — the process that
# plays kubelet — so pods get scheduled but never run. A spec edited while the controller is
# stopped gives "observedGeneration behind".
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
H="${root}/tests/e2e/harness"
CONTROLLER_BIN="${FLOTILLA_CONTROLLER_BIN:-${CARGO_TARGET_DIR:-${root}/target}/debug/flotilla-controller}"
export FLOTILLA_E2E_DIR="${FLOTILLA_E2E_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/flotilla-argocd-XXXXXX")}"
# shellcheck source=../e2e/harness/lib.sh
source "${H}/lib.sh"
out="${here}/fixtures"
mkdir -p "${out}"
[[ -x "${CONTROLLER_BIN}" ]] || die "${CONTROLLER_BIN} does not exist (cargo build -p flotilla-controllers)"

ctl_pid=""
stop_controller() {
  if [[ -n "${ctl_pid}" ]]; then kill "${ctl_pid}" 2>/dev/null || true; wait "${ctl_pid}" 2>/dev/null || true; ctl_pid=""; fi
}
cleanup() {
  local rc=$?
  stop_controller
  if [[ "${FLOTILLA_E2E_KEEP:-0}" == 1 ]]; then log "keeping ${FLOTILLA_E2E_DIR}"; else
    bash "${H}/down.sh" >/dev/null 2>&1 || true
    rm -rf "${FLOTILLA_E2E_DIR}"
  fi
  exit "${rc}"
}
trap cleanup EXIT
start_controller() {
  "${CONTROLLER_BIN}" --kubeconfig "${CKC}" --lease-namespace flotilla-system --identity capture \
    --probe-addr "127.0.0.1:$((20000 + RANDOM % 20000))" --poll-seconds 2 --member-timeout-seconds 3 \
    >>"${FLOTILLA_E2E_DIR}/controller.log" 2>&1 &
  ctl_pid=$!
}

bash "${H}/up.sh" control a b >/dev/null
CKC="${FLOTILLA_E2E_DIR}/control.kubeconfig"
k() { kubectl --kubeconfig "${CKC}" "$@"; }
bash "${H}/gpu-nodes.sh" "${FLOTILLA_E2E_DIR}/a.kubeconfig" h100 --count 2 --region eu-central-1 >/dev/null
bash "${H}/gpu-nodes.sh" "${FLOTILLA_E2E_DIR}/b.kubeconfig" h100 --count 2 --region eu-west-3 >/dev/null
k apply --server-side -f "${root}/charts/flotilla/crds/" >/dev/null
for ns in flotilla-system ml; do k create namespace "${ns}" >/dev/null; done
for m in a b; do
  k -n flotilla-system create secret generic "${m}-kubeconfig" --from-file=kubeconfig="${FLOTILLA_E2E_DIR}/${m}.kubeconfig" >/dev/null
done

# save FILE KUBECTL-GET-ARGS...: the object exactly as the API server returns it (kubectl
# leaves managedFields out).
save() {
  local file="$1"
  shift
  k get "$@" -o json >"${out}/${file}.json"
  log "captured ${file}.json"
}
# until SECONDS JSONPATH WANT KUBECTL-ARGS...: wait for a field.
until_is() {
  local secs="$1" path="$2" want="$3" i
  shift 3
  for ((i = 0; i < secs; i++)); do
    [[ "$(k get "$@" -o "jsonpath=${path}" 2>/dev/null)" == "${want}" ]] && return 0
    sleep 1
  done
  die "$* ${path} is not ${want} after ${secs} s: $(k get "$@" -o json | tail -n 60)"
}
cond() { echo "{.status.conditions[?(@.type==\"$1\")].${2:-status}}"; }

k apply -f - >/dev/null <<'EOF'
apiVersion: flotilla.dev/v1alpha1
kind: InferenceClass
metadata: {name: h100-sxm-80g}
spec:
  device:
    driver: gpu.nvidia.com
    attributes: {productName: {string: "NVIDIA H100 80GB HBM3"}, architecture: {string: Hopper}}
    capacity: {memory: 80Gi}
  devicesPerNode: 8
  provisioning: {aws: {instanceTypes: [p5.48xlarge]}}
  pricePerNodeHour: {reserved: "62.00", onDemand: "98.32", spot: "39.00"}
EOF
for m in a b; do
  region=$([[ ${m} == a ]] && echo eu-central-1 || echo eu-west-3)
  k apply -f - >/dev/null <<EOF
apiVersion: flotilla.dev/v1alpha1
kind: InferenceCluster
metadata: {name: eu-${m}, labels: {site: "${m}"}}
spec:
  provider: {sim: {cloud: fixtures}}
  region: ${region}
  zones: [${region}a]
  jurisdiction: EU
  country: DE
  credentials: {secretRef: {namespace: flotilla-system, name: ${m}-kubeconfig}}
  endpoint: http://127.0.0.1:1/eu-${m}
  pools: [{name: h100, class: h100-sxm-80g, minNodes: 0, maxNodes: 4, capacityTypes: [on-demand]}]
EOF
done
k apply -f - >/dev/null <<'EOF'
apiVersion: flotilla.dev/v1alpha1
kind: InferenceCluster
metadata: {name: eu-lost-credentials, labels: {site: lost}}
spec:
  provider: {sim: {cloud: fixtures}}
  region: eu-north-1
  jurisdiction: EU
  credentials: {secretRef: {namespace: flotilla-system, name: eu-lost-credentials-kubeconfig}}
  endpoint: http://127.0.0.1:1/lost
  pools: [{name: h100, class: h100-sxm-80g, maxNodes: 4, capacityTypes: [on-demand]}]
---
apiVersion: flotilla.dev/v1alpha1
kind: InferenceCluster
metadata: {name: eu-a-empty-pool, labels: {site: empty}}
spec:
  provider: {sim: {cloud: fixtures}}
  region: eu-central-1
  jurisdiction: EU
  credentials: {secretRef: {namespace: flotilla-system, name: a-kubeconfig}}
  endpoint: http://127.0.0.1:1/empty
  pools: [{name: h100-reserved, class: h100-sxm-80g, maxNodes: 4, capacityTypes: [reserved]}]
EOF
# md NAME REPLICAS SITE [extra placement JSON fields]
md() {
  k apply -f - >/dev/null <<EOF
apiVersion: flotilla.dev/v1alpha1
kind: ModelDeployment
metadata: {name: $1, namespace: ml}
spec:
  model: {name: $1, source: "hf://meta-llama/Llama-3.3-70B-Instruct@main"}
  replicas: $2
  engine: {image: "vllm/vllm-openai:v0.11.0", args: ["--tensor-parallel-size=4"]}
  topology: {type: TensorParallel, devicesPerReplica: 4}
  devices: {alternatives: [{class: h100-sxm-80g}]}
  placement:
    clusterSelector: {matchLabels: {site: "$3"}}
    sovereignty: {allowedJurisdictions: [${4:-EU}]}
EOF
}

# Before any controller: no status at all.
md llama-ready 1 a
save inferencecluster-no-status inferencecluster eu-a
save modeldeployment-no-status -n ml modeldeployment llama-ready
save inferenceclass-no-status inferenceclass h100-sxm-80g
# No controller for these two kinds yet: the example fleet's objects as created, with no status.
k apply -f "${root}/examples/fleet/caches.yaml" -f "${root}/examples/fleet/claims.yaml" >/dev/null
save modelcache-no-status -n ml modelcache llama-3.3-70b
save capacityclaim-no-status -n ml capacityclaim llama-405b-launch

start_controller
until_is 60 "$(cond Ready)" True inferencecluster eu-a
until_is 60 "$(cond Ready)" True inferencecluster eu-b
until_is 30 "$(cond Reachable reason)" SecretMissing inferencecluster eu-lost-credentials
until_is 30 "$(cond CapacityKnown reason)" NoMatchingNodes inferencecluster eu-a-empty-pool
save inferencecluster-ready inferencecluster eu-a
save inferencecluster-secret-missing inferencecluster eu-lost-credentials
save inferencecluster-no-matching-nodes inferencecluster eu-a-empty-pool
until_is 60 "$(cond Ready)" True -n ml modeldeployment llama-ready
save modeldeployment-ready -n ml modeldeployment llama-ready

md llama-zero 0 a
until_is 30 "$(cond Ready reason)" AsExpected -n ml modeldeployment llama-zero
save modeldeployment-scaled-to-zero -n ml modeldeployment llama-zero
# eu-a has 16 devices, llama-ready holds 4: 4 more replicas of 4 do not fit.
md llama-too-big 4 a
until_is 30 "$(cond Placed reason)" InsufficientCapacity -n ml modeldeployment llama-too-big
save modeldeployment-insufficient-capacity -n ml modeldeployment llama-too-big
md llama-us-only 1 a US
until_is 30 "$(cond Placed reason)" NoEligibleCluster -n ml modeldeployment llama-us-only
save modeldeployment-no-eligible-cluster -n ml modeldeployment llama-us-only

# On b: one model ready with one replica, one ready on a, then b's kwok stops.
md llama-partial 1 b
k -n ml delete modeldeployment llama-too-big --wait=false >/dev/null  # frees eu-a for llama-moving
md llama-moving 1 a
until_is 60 "$(cond Ready)" True -n ml modeldeployment llama-partial
until_is 60 "$(cond Ready)" True -n ml modeldeployment llama-moving
kwok_pid=$(cat "${FLOTILLA_E2E_DIR}/kwok/clusters/b/pids/kwok-controller.pid")
kill "${kwok_pid}"
log "stopped b's kwok controller (pid ${kwok_pid}): pods on b are scheduled but never run"
md llama-partial 2 b
md llama-moving 1 b
md llama-rolling 1 b
until_is 30 "$(cond Degraded reason)" ReplicasNotReady -n ml modeldeployment llama-partial
until_is 30 "$(cond Ready reason)" NoReplicasReady -n ml modeldeployment llama-rolling
until_is 30 '{.status.placements[*].cluster}' 'eu-a eu-b' -n ml modeldeployment llama-moving
save modeldeployment-partially-ready -n ml modeldeployment llama-partial
save modeldeployment-rolling-out -n ml modeldeployment llama-rolling
save modeldeployment-moving -n ml modeldeployment llama-moving

# Spec changes the controller has not seen yet.
stop_controller
md llama-ready 2 a
k patch inferencecluster eu-a --type merge -p '{"spec":{"zones":["eu-central-1a","eu-central-1b"]}}' >/dev/null
save modeldeployment-generation-behind -n ml modeldeployment llama-ready
save inferencecluster-generation-behind inferencecluster eu-a

# A member that stops answering.
start_controller
bash "${H}/stop.sh" b >/dev/null 2>&1
until_is 60 "$(cond Reachable reason)" Unreachable inferencecluster eu-b
save inferencecluster-unreachable inferencecluster eu-b
log "fixtures in ${out}"
