#!/usr/bin/env bash
# `helm install` of charts/flotilla into a real control cluster (tests/e2e/harness; kwok runs
# the pods, no image is pulled), then proves the chart's RBAC:
#   1. the CRDs are established and both Deployments become Available (helm --wait);
#   2. `kubectl auth can-i --as system:serviceaccount:...` for every verb the controller and the
#      gateway need, and for what they must not do (Secrets outside their namespaces or not
#      named, the member kubeconfigs for the gateway, writes to specs and to other kinds, other
#      Leases);
#   3. the real flotilla-controller binary, authenticated with a token of the chart's
#      ServiceAccount, leads, reconciles a member cluster and a ModelDeployment to Ready,
#      records its event, and cannot read a kubeconfig Secret outside the allowed namespace; in
#      the member it acts only as examples/member-rbac/flotilla-member.yaml allows, which is
#      enough to apply the workloads and, on deletion, remove them all; the real
#      flotilla-gateway, with a token of its ServiceAccount and the chart's flags
#      (--control-cluster, --keys-namespace), gets ready, holds its Lease, routes the
#      ModelDeployment, authenticates with a key from a Secret, writes `Serving`, and is never
#      refused anything;
#   4. `helm upgrade` changes the Deployment and, with controller.clusterProfiles.enabled, grants
#      read-only access to clusterprofiles.multicluster.x-k8s.io (the ClusterProfile CRD, from
#      its Go module, is installed after the chart: the chart does not need it); `helm
#      uninstall` leaves the CRDs;
#   5. (before 4) the hand-written tests/argocd/fixtures/*.api-shape.json statuses are accepted,
#      field for field, by the CRDs' status subresource;
#   6. (before 4) examples/gitops/argocd/*.yaml pass a server-side dry run against Argo CD's
#      own CRDs (tests/argocd/argocd-crds.sh);
#   7. (before 4) kube-state-metrics with docs/monitoring/kube-state-metrics-flotilla.yaml
#      exposes the condition series the chart's alerts on reasons read;
#   8. (before 4) the `full` snapshot (every toggle on) passes a server-side dry run, with
#      prometheus-operator's CRDs for ServiceMonitor and PrometheusRule;
#   9. (before 4) the dashboard and alert rules select only metric names the real controller,
#      gateway and kube-state-metrics export, and the gateway loads the routing table the chart
#      renders in file mode (values/gateway-file.yaml).
# Starts its own clusters (control + one member) in a fresh FLOTILLA_E2E_DIR and tears them
# down on exit (FLOTILLA_E2E_KEEP=1 keeps them).
#
# Environment: HELM, FLOTILLA_CONTROLLER_BIN (default target/debug/flotilla-controller, which
# `cargo test --workspace` builds; step 3 is skipped, loudly, when it does not exist).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
H="${root}/tests/e2e/harness"
HELM="${HELM:-$(bash "${here}/build-helm.sh")}"
CONTROLLER_BIN="${FLOTILLA_CONTROLLER_BIN:-${CARGO_TARGET_DIR:-${root}/target}/debug/flotilla-controller}"
export FLOTILLA_E2E_DIR="${FLOTILLA_E2E_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/flotilla-helm-XXXXXX")}"
# A loopback port nothing listens on now (the kernel's choice; a random pick once landed on a
# harness process and the controller's metrics were read from it).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# shellcheck source=../e2e/harness/lib.sh
source "${H}/lib.sh"

NS=flotilla-system
KNS=flotilla-system-api-keys  # the chart's default gateway.apiKeys.namespace
MNS=flotilla-system-members   # the chart's default controller.memberSecrets.namespaces
fail=0
t0=$(date +%s)
ok() { printf 'ok   %s [%ds]\n' "$*" $(($(date +%s) - t0)); }
bad() { printf 'FAIL %s [%ds]\n' "$*" $(($(date +%s) - t0)); fail=1; }

ctl_pid="" gw_pid=""
cleanup() {
  local rc=$? pid
  for pid in "${ctl_pid}" "${gw_pid}"; do
    if [[ -n "${pid}" ]] && kill -0 "${pid}" 2>/dev/null; then
      kill "${pid}" 2>/dev/null || true
      wait "${pid}" 2>/dev/null || true
    fi
  done
  if [[ "${FLOTILLA_E2E_KEEP:-0}" == 1 ]]; then
    log "keeping clusters in ${FLOTILLA_E2E_DIR}"
  else
    bash "${H}/down.sh" >/dev/null 2>&1 || true
    rm -rf "${FLOTILLA_E2E_DIR}"
  fi
  exit "${rc}"
}
trap cleanup EXIT

bash "${H}/up.sh" control member >/dev/null
CKC="${FLOTILLA_E2E_DIR}/control.kubeconfig"
MKC="${FLOTILLA_E2E_DIR}/member.kubeconfig"
k() { kubectl --kubeconfig "${CKC}" "$@"; }

# A plain node for the chart's pods (kwok keeps it Ready and "runs" what lands on it).
k apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: system-0
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/os: linux, kubernetes.io/arch: amd64, kubernetes.io/hostname: system-0, type: kwok}
status:
  allocatable: {cpu: "8", memory: 32Gi, pods: "110"}
  capacity: {cpu: "8", memory: 32Gi, pods: "110"}
EOF
for ns in "${NS}" "${KNS}" "${MNS}" ml other; do k create namespace "${ns}" >/dev/null; done
# The gateway's API keys (a labelled Secret in the keys namespace, digests only), a member
# kubeconfig where the controller may read it, and one where it may not.
API_KEY=helm-test-key-0123456789
printf 'keys:\n  - {id: helm-test, sha256: %s, models: [llama]}\n' \
  "$(printf %s "${API_KEY}" | sha256sum | cut -d' ' -f1)" >"${FLOTILLA_E2E_DIR}/keys.yaml"
k -n "${KNS}" create secret generic gateway-keys --from-file=keys.yaml="${FLOTILLA_E2E_DIR}/keys.yaml" >/dev/null
k -n "${KNS}" label secret gateway-keys flotilla.dev/api-keys=true >/dev/null
# The member side of least privilege: examples/member-rbac/flotilla-member.yaml applied to the
# member, and a kubeconfig for its ServiceAccount (long-lived token Secret) is what the
# controller gets.
kubectl --kubeconfig "${MKC}" apply -f "${root}/examples/member-rbac/flotilla-member.yaml" >/dev/null
member_token=""
for _ in $(seq 30); do
  member_token=$(kubectl --kubeconfig "${MKC}" -n flotilla-system get secret flotilla-member-token -o 'jsonpath={.data.token}' 2>/dev/null | base64 -d)
  [[ -n "${member_token}" ]] && break
  sleep 1
done
[[ -n "${member_token}" ]] || die "the member's token controller did not fill flotilla-member-token"
RKC="${FLOTILLA_E2E_DIR}/member-restricted.kubeconfig"
cat >"${RKC}" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: member, cluster: {server: "$(kubectl --kubeconfig "${MKC}" config view --raw --minify -o 'jsonpath={.clusters[0].cluster.server}')", certificate-authority-data: "$(kubectl --kubeconfig "${MKC}" config view --raw --minify -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}')"}}]
users: [{name: flotilla-member, user: {token: "${member_token}"}}]
contexts: [{name: member, context: {cluster: member, user: flotilla-member}}]
current-context: member
EOF
k -n "${MNS}" create secret generic member-kubeconfig --from-file=kubeconfig="${RKC}" >/dev/null
k -n other create secret generic member-kubeconfig --from-file=kubeconfig="${RKC}" >/dev/null

# ---- 1. install -------------------------------------------------------------------------
start=$(date +%s)
"${HELM}" install flotilla "${root}/charts/flotilla" --kubeconfig "${CKC}" -n "${NS}" \
  --wait --timeout 120s >/dev/null
ok "helm install --wait ($(($(date +%s) - start)) s)"
for crd in inferenceclasses inferenceclusters modeldeployments modelcaches capacityclaims fleetquotas; do
  if k wait --for condition=Established "crd/${crd}.flotilla.dev" --timeout 30s >/dev/null; then
    ok "crd ${crd}.flotilla.dev established"
  else bad "crd ${crd}.flotilla.dev not established"; fi
done
for d in flotilla-controller flotilla-gateway; do
  avail=$(k -n "${NS}" get deploy "${d}" -o jsonpath='{.status.availableReplicas}')
  if [[ "${avail}" == 2 ]]; then ok "deployment ${d}: 2/2 available"; else bad "deployment ${d}: ${avail:-0}/2 available"; fi
done
# What the pods would run as (kwok does not enforce it; the API server stores it).
sc=$(k -n "${NS}" get pod -l app.kubernetes.io/component=controller \
  -o jsonpath='{.items[0].spec.containers[0].securityContext.readOnlyRootFilesystem},{.items[0].spec.containers[0].securityContext.capabilities.drop[0]},{.items[0].spec.securityContext.runAsNonRoot},{.items[0].spec.securityContext.seccompProfile.type}')
if [[ "${sc}" == "true,ALL,true,RuntimeDefault" ]]; then ok "controller pod: read-only root, drop ALL, non-root, RuntimeDefault"
else bad "controller pod security context: ${sc}"; fi

# ---- 2. kubectl auth can-i ----------------------------------------------------------------
# The chart was installed without the ClusterProfile CRD; install it now so that can-i can name
# clusterprofiles.multicluster.x-k8s.io (kubectl resolves the resource through discovery).
if err=$(k apply --server-side -f "$(bash "${H}/cluster-inventory-crd.sh" 2>/dev/null)" 2>&1 >/dev/null) \
   && k wait --for=condition=Established crd/clusterprofiles.multicluster.x-k8s.io --timeout=30s >/dev/null; then
  ok "ClusterProfile CRD (sigs.k8s.io/cluster-inventory-api) installed after the chart"
else bad "installing the ClusterProfile CRD: ${err}"; fi
# can SA EXPECT VERB RESOURCE [kubectl flags...]
can() {
  local sa="$1" want="$2" verb="$3" res="$4"
  shift 4
  local got
  got=$(k auth can-i "${verb}" "${res}" --as "system:serviceaccount:${NS}:${sa}" "$@" 2>/dev/null || true)
  if [[ "${got}" == "${want}" ]]; then ok "${sa} ${want/no/cannot} ${verb} ${res} $*"
  else bad "${sa}: can-i ${verb} ${res} $* = ${got:-error}, want ${want}"; fi
}
C=flotilla-controller G=flotilla-gateway
# The controller: what it does ...
for r in inferenceclasses inferenceclusters modeldeployments modelcaches capacityclaims fleetquotas; do
  for v in get list watch; do can "$C" yes "$v" "$r.flotilla.dev" -A; done
done
can "$C" yes patch fleetquotas.flotilla.dev --subresource=status -n ml
can "$C" no patch fleetquotas.flotilla.dev -n ml  # a quota's spec is the platform team's
can "$C" no create fleetquotas.flotilla.dev -n ml
can "$C" yes patch modelcaches.flotilla.dev --subresource=status -n ml
can "$C" yes patch capacityclaims.flotilla.dev --subresource=status -n ml
can "$C" yes create capacityclaims.flotilla.dev -n ml  # the claim a deployment owns
can "$C" yes delete capacityclaims.flotilla.dev -n ml
can "$C" yes patch inferenceclusters.flotilla.dev --subresource=status
can "$C" yes patch modeldeployments.flotilla.dev --subresource=status -n ml
can "$C" yes patch modeldeployments.flotilla.dev -n ml  # its finalizer
can "$C" yes create events.events.k8s.io -n ml
can "$C" yes patch events.events.k8s.io -n ml
can "$C" yes create leases.coordination.k8s.io -n "${NS}"
can "$C" yes get lease/flotilla-controller -n "${NS}"
can "$C" yes patch lease/flotilla-controller -n "${NS}"
can "$C" yes get secret/member-kubeconfig -n "${MNS}"
can "$C" yes patch inferenceclusters.flotilla.dev  # its finalizer (deletionPolicy)
# ... and what it must not: no Secret but the member kubeconfigs' -- not Helm's release Secret.
helm_secret=$(k -n "${NS}" get secrets -l owner=helm,name=flotilla -o name | head -n 1)
if [[ "${helm_secret}" == secret/sh.helm.release.v1.flotilla.v* ]]; then ok "Helm release Secret ${helm_secret} exists"
else bad "no Helm release Secret in ${NS}: ${helm_secret:-none}"; fi
can "$C" no get "${helm_secret:-secret/sh.helm.release.v1.flotilla.v1}" -n "${NS}"
can "$C" no get secret/member-kubeconfig -n "${NS}"
can "$C" no get secret/member-kubeconfig -n other
can "$C" no get secret/member-kubeconfig -n ml
# The kubeconfigs come from watches (one per Secret, by name): list/watch in their namespace only.
can "$C" yes list secrets -n "${MNS}"
can "$C" yes watch secrets -n "${MNS}"
can "$C" no list secrets -n "${NS}"
can "$C" no watch secrets -n "${NS}"
can "$C" no watch secrets -n other
can "$C" no update secret/member-kubeconfig -n "${MNS}"
can "$C" no get secrets -n kube-system
can "$C" no patch lease/kube-scheduler -n kube-system
can "$C" no patch lease/other-lease -n "${NS}"
can "$C" no delete lease/flotilla-controller -n "${NS}"
for v in create update delete; do
  can "$C" no "$v" inferenceclusters.flotilla.dev
  can "$C" no "$v" modeldeployments.flotilla.dev -n ml
done
can "$C" yes patch inferenceclasses.flotilla.dev --subresource=status  # Ready / InvalidSpec (controllers/src/class.rs)
can "$C" no patch inferenceclasses.flotilla.dev
can "$C" no update modeldeployments.flotilla.dev --subresource=status -n ml
can "$C" no create modelcaches.flotilla.dev -n ml
can "$C" no update modelcaches.flotilla.dev --subresource=status -n ml
can "$C" no delete modelcaches.flotilla.dev -n ml
can "$C" no create deployments.apps -n ml
can "$C" no create configmaps -n "${NS}"
can "$C" no create events -n ml  # core/v1 events: it uses events.k8s.io only
can "$C" no list clusterprofiles.multicluster.x-k8s.io -A  # only with controller.clusterProfiles.enabled
# The gateway (control-cluster mode, keys from Secrets): what it does ...
for r in modeldeployments inferenceclusters; do
  for v in get list watch; do can "$G" yes "$v" "$r.flotilla.dev" -A; done
done
can "$G" yes patch modeldeployments.flotilla.dev --subresource=status -n ml
for v in get update patch; do can "$G" yes "$v" modeldeployments.flotilla.dev --subresource=scale -n ml; done
can "$G" yes create events.events.k8s.io -n ml
can "$G" yes create leases.coordination.k8s.io -n "${NS}"
can "$G" yes get lease/flotilla-gateway -n "${NS}"
can "$G" yes patch lease/flotilla-gateway -n "${NS}"
for v in get list watch; do can "$G" yes "$v" secrets -n "${KNS}"; done
# ... and what it must not: above all the member kubeconfigs, in the release namespace.
can "$G" no get secret/member-kubeconfig -n "${MNS}"
can "$G" no list secrets -n "${MNS}"
can "$G" no list secrets -n "${NS}"
can "$G" no watch secrets -n "${NS}"
can "$G" no get "${helm_secret:-secret/sh.helm.release.v1.flotilla.v1}" -n "${NS}"
can "$G" no get secret/member-kubeconfig -n other
can "$G" no list secrets -A
can "$G" no create secrets -n "${KNS}"
can "$G" no update secret/gateway-keys -n "${KNS}"
for v in patch update; do can "$G" no "$v" modeldeployments.flotilla.dev -n ml; done
can "$G" no update modeldeployments.flotilla.dev --subresource=status -n ml
for v in create update patch delete; do can "$G" no "$v" inferenceclusters.flotilla.dev; done
can "$G" no patch inferenceclusters.flotilla.dev --subresource=status
can "$G" no list inferenceclasses.flotilla.dev
can "$G" no update lease/flotilla-gateway -n "${NS}"
can "$G" no delete lease/flotilla-gateway -n "${NS}"
can "$G" no patch lease/flotilla-controller -n "${NS}"
can "$G" no create events -n ml  # core/v1 events: it uses events.k8s.io only

# ---- 3. the real controller under the chart's ServiceAccount --------------------------------
if [[ ! -x "${CONTROLLER_BIN}" ]]; then
  printf 'SKIP the real controller under the chart ServiceAccount: %s does not exist (cargo test --workspace builds it)\n' "${CONTROLLER_BIN}"
else
  token=$(k -n "${NS}" create token flotilla-controller --duration 1h)
  server=$(k config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
  ca=$(k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
  SAKC="${FLOTILLA_E2E_DIR}/controller-sa.kubeconfig"
  cat >"${SAKC}" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: control, cluster: {server: "${server}", certificate-authority-data: "${ca}"}}]
users: [{name: flotilla-controller, user: {token: "${token}"}}]
contexts: [{name: sa, context: {cluster: control, user: flotilla-controller}}]
current-context: sa
EOF
  chmod 600 "${SAKC}"
  bash "${H}/gpu-nodes.sh" "${MKC}" h100 --count 1 --region eu-central-1 >/dev/null
  k apply -f - >/dev/null <<'EOF'
apiVersion: flotilla.dev/v1alpha1
kind: InferenceClass
metadata: {name: h100}
spec:
  device: {driver: gpu.nvidia.com, attributes: {productName: {string: "NVIDIA H100 80GB HBM3"}}, capacity: {memory: 80Gi}}
  devicesPerNode: 8
  pricePerNodeHour: {onDemand: "98.32"}
---
apiVersion: flotilla.dev/v1alpha1
kind: InferenceCluster
metadata: {name: member}
spec:
  provider: {sim: {cloud: helm-test}}
  region: eu-central-1
  jurisdiction: EU
  credentials: {secretRef: {namespace: flotilla-system-members, name: member-kubeconfig}}
  endpoint: http://127.0.0.1:1/member
  pools: [{name: h100, class: h100, maxNodes: 1, capacityTypes: [on-demand]}]
---
apiVersion: flotilla.dev/v1alpha1
kind: InferenceCluster
metadata: {name: outside}
spec:
  provider: {sim: {cloud: helm-test}}
  region: eu-west-3
  jurisdiction: EU
  credentials: {secretRef: {namespace: other, name: member-kubeconfig}}
  endpoint: http://127.0.0.1:1/outside
  pools: [{name: h100, class: h100, maxNodes: 1, capacityTypes: [on-demand]}]
---
apiVersion: flotilla.dev/v1alpha1
kind: ModelDeployment
metadata: {name: llama, namespace: ml}
spec:
  model: {name: llama, source: hf://org/llama}
  replicas: 2
  engine: {image: vllm/vllm-openai:v0.11.0}
  topology: {type: TensorParallel, devicesPerReplica: 4}
  devices: {alternatives: [{class: h100}]}
  placement: {sovereignty: {allowedJurisdictions: [EU]}}
EOF
  port=$(free_port)
  log "running ${CONTROLLER_BIN} as system:serviceaccount:${NS}:flotilla-controller"
  "${CONTROLLER_BIN}" --kubeconfig "${SAKC}" --lease-namespace "${NS}" --identity helm-test-0 \
    --probe-addr "127.0.0.1:${port}" --poll-seconds 2 --member-timeout-seconds 4 \
    >"${FLOTILLA_E2E_DIR}/controller.log" 2>&1 &
  ctl_pid=$!
  # wait_for DESCRIPTION SECONDS CMD...: retry CMD every second.
  wait_for() {
    local what="$1" secs="$2" i
    shift 2
    for ((i = 0; i < secs; i++)); do
      if "$@" >/dev/null 2>&1; then ok "${what}"; return 0; fi
      sleep 1
    done
    bad "${what} (not within ${secs} s)"
  }
  jp() { k "$@" 2>/dev/null; }
  is() { [[ "$(jp "${@:2}")" == "$1" ]]; }
  wait_for "controller holds the Lease" 30 is helm-test-0 -n "${NS}" get lease flotilla-controller -o 'jsonpath={.spec.holderIdentity}'
  wait_for "InferenceCluster member Ready=True (status patched, Secret read)" 60 \
    is True get inferencecluster member -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}'
  wait_for "ModelDeployment ml/llama Ready=True (finalizer, member apply, status patched)" 90 \
    is True -n ml get modeldeployment llama -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}'
  wait_for "PlacementChanged event recorded in ml" 30 \
    is PlacementChanged -n ml get events.events.k8s.io -o 'jsonpath={.items[0].reason}'
  if is flotilla.dev/member-cleanup -n ml get modeldeployment llama -o 'jsonpath={.metadata.finalizers[0]}'; then
    ok "ModelDeployment carries the controller's finalizer"
  else bad "ModelDeployment has no finalizer"; fi
  mk() { kubectl --kubeconfig "${MKC}" "$@"; }
  if [[ "$(mk -n ml get deployments,services,resourceclaimtemplates,poddisruptionbudgets -l flotilla.dev/deployment=ml.llama -o name | wc -l)" -ge 4 ]]; then
    ok "member: Deployment, Service, ResourceClaimTemplate and PodDisruptionBudget applied with the member-rbac identity"
  else bad "member objects: $(mk -n ml get deployments,services,resourceclaimtemplates,poddisruptionbudgets -o name 2>&1)"; fi
  # The real gateway as the chart runs it (control-cluster mode, keys from the keys namespace,
  # its Lease in the release namespace), with a token of the gateway's ServiceAccount.
  GATEWAY_BIN="${FLOTILLA_GATEWAY_BIN:-$(dirname "${CONTROLLER_BIN}")/flotilla-gateway}"
  if [[ ! -x "${GATEWAY_BIN}" ]]; then
    printf 'SKIP the real gateway under the chart ServiceAccount: %s does not exist\n' "${GATEWAY_BIN}"
  else
    GWKC="${FLOTILLA_E2E_DIR}/gateway-sa.kubeconfig"
    cat >"${GWKC}" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: control, cluster: {server: "${server}", certificate-authority-data: "${ca}"}}]
users: [{name: flotilla-gateway, user: {token: "$(k -n "${NS}" create token flotilla-gateway --duration 1h)"}}]
contexts: [{name: sa, context: {cluster: control, user: flotilla-gateway}}]
current-context: sa
EOF
    chmod 600 "${GWKC}"
    gwport=$(free_port)
    log "running ${GATEWAY_BIN} --control-cluster as system:serviceaccount:${NS}:flotilla-gateway"
    "${GATEWAY_BIN}" --control-cluster --kubeconfig "${GWKC}" --keys-namespace "${KNS}" \
      --lease-namespace "${NS}" --identity helm-gw-0 --listen "127.0.0.1:${gwport}" \
      >"${FLOTILLA_E2E_DIR}/gateway-control.log" 2>&1 &
    gw_pid=$!
    # /readyz: 200, or 503 only for want of an available cluster once the feed is in sync
    # (the member's endpoint is a placeholder) -- never stuck before the first sync.
    gw_ready() {
      local body
      body=$(curl -s -w ' %{http_code}' "http://127.0.0.1:${gwport}/readyz")
      [[ "${body}" == *' 200' || "${body}" == *'routing feed in sync'*' 503' ]]
    }
    wait_for "gateway (control-cluster mode) ready: routing feed in sync" 30 gw_ready
    wait_for "gateway holds its Lease ${NS}/flotilla-gateway" 30 \
      is helm-gw-0 -n "${NS}" get lease flotilla-gateway -o 'jsonpath={.spec.holderIdentity}'
    wait_for "gateway wrote Serving on ModelDeployment ml/llama" 30 \
      is True -n ml get modeldeployment llama -o 'jsonpath={.status.conditions[?(@.type=="Serving")].status}'
    log "ml/llama Serving: $(jp -n ml get modeldeployment llama -o 'jsonpath={.status.conditions[?(@.type=="Serving")].reason}: {.status.conditions[?(@.type=="Serving")].message}')"
    models=$(curl -s -H "Authorization: Bearer ${API_KEY}" "http://127.0.0.1:${gwport}/v1/models")
    if [[ "${models}" == *'"llama"'* ]]; then ok "gateway: the key from Secret ${KNS}/gateway-keys lists llama (routing table from the ModelDeployment)"
    else bad "gateway /v1/models with the key: ${models}"; fi
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer not-a-key' "http://127.0.0.1:${gwport}/v1/models")
    if [[ "${code}" == 401 ]]; then ok "gateway: an unknown key gets 401"; else bad "gateway: unknown key got ${code}"; fi
    kill "${gw_pid}" 2>/dev/null || true
    wait "${gw_pid}" 2>/dev/null || true
    if grep -qi 'forbidden' "${FLOTILLA_E2E_DIR}/gateway-control.log"; then
      bad "gateway was refused: $(grep -i forbidden "${FLOTILLA_E2E_DIR}/gateway-control.log" | head -n 3)"
    else ok "gateway log: no Forbidden"; fi
    if [[ "${fail}" != 0 ]]; then tail -n 30 "${FLOTILLA_E2E_DIR}/gateway-control.log"; fi
  fi
  # The Secret outside memberSecrets.namespaces stays unread: the cluster is not Reachable and
  # the API server said Forbidden.
  wait_for "InferenceCluster outside: Reachable=False" 30 \
    is False get inferencecluster outside -o 'jsonpath={.status.conditions[?(@.type=="Reachable")].status}'
  if grep -q 'secrets \\"member-kubeconfig\\" is forbidden\|Forbidden\|forbidden' "${FLOTILLA_E2E_DIR}/controller.log" \
     || jp get inferencecluster outside -o 'jsonpath={.status.conditions[?(@.type=="Reachable")].message}' | grep -qi 'forbidden\|403'; then
    ok "reading Secret other/member-kubeconfig was forbidden"
  else
    bad "no sign that Secret other/member-kubeconfig was refused: $(jp get inferencecluster outside -o 'jsonpath={.status.conditions[?(@.type=="Reachable")].message}')"
  fi
  curl -sf "http://127.0.0.1:${port}/metrics" >"${FLOTILLA_E2E_DIR}/controller.metrics" || true
  # Deletion runs the finalizer: every member object is removed with the member-rbac identity.
  # "outside", never reached and never running llama, holds nothing up.
  k -n ml delete modeldeployment llama --wait=false >/dev/null
  gone() { ! k -n ml get modeldeployment llama >/dev/null 2>&1; }
  wait_for "ModelDeployment deleted: finalizer cleaned the member and removed itself" 60 gone
  k delete inferencecluster outside --wait=false >/dev/null
  outside_gone() { ! k get inferencecluster outside >/dev/null 2>&1; }
  wait_for "InferenceCluster outside deleted (never reached: its finalizer holds nothing)" 30 outside_gone
  left=$(mk -n ml get deployments,services,resourceclaimtemplates,poddisruptionbudgets -l flotilla.dev/deployment=ml.llama -o name 2>&1 | wc -l)
  if [[ "${left}" == 0 ]]; then ok "member: nothing of ml/llama left"; else bad "member still has ${left} objects of ml/llama"; fi
  # Apart from that Secret, the controller was never refused anything. (The Secret is watched by
  # name, so kube-runtime's watcher logs its own 403 for it, naming it as `secrets
  # "member-kubeconfig" ... in the namespace "other"`.)
  other_forbidden=$(grep -i 'forbidden' "${FLOTILLA_E2E_DIR}/controller.log" | grep -v 'other/member-kubeconfig' \
    | grep -v -E 'secrets \\"member-kubeconfig\\" is forbidden: .* in the namespace \\"other\\"' || true)
  if [[ -z "${other_forbidden}" ]]; then ok "controller log: no other Forbidden"
  else bad "controller was refused: ${other_forbidden}"; fi
  kill "${ctl_pid}"
  wait "${ctl_pid}" 2>/dev/null || true
  ctl_pid=""
  if [[ "${fail}" != 0 ]]; then tail -n 40 "${FLOTILLA_E2E_DIR}/controller.log"; fi
fi

# ---- 5. the hand-written Argo CD fixtures have the API's exact shape ----------------------
# Each *.api-shape.json status (tests/argocd) goes through the status subresource with
# server-side apply, whose strict field validation refuses any field the CRD does not define;
# reading it back must give the same status.
for f in "${root}"/tests/argocd/fixtures/*.api-shape.json; do
  name=$(basename "${f}")
  if ! err=$(k apply --server-side --field-manager=fixtures -f "${f}" 2>&1 >/dev/null) \
     || ! err=$(k apply --server-side --field-manager=fixtures --subresource=status -f "${f}" 2>&1 >/dev/null); then
    bad "${name}: refused by the CRD: ${err}"
    continue
  fi
  want=$(k apply --dry-run=client -f "${f}" -o 'jsonpath={.status}')
  got=$(k get -f "${f}" -o 'jsonpath={.status}')
  if [[ -n "${want}" && "${want}" == "${got}" ]]; then ok "${name}: status accepted as is by the CRD"
  else bad "${name}: status read back differs"; diff <(echo "${want}") <(echo "${got}") | head -n 5; fi
done

# ---- 6. the Argo CD manifests of examples/gitops against Argo CD's own CRDs --------------
argocrds=$(bash "${root}/tests/argocd/argocd-crds.sh")
argover=$(basename "$(dirname "$(dirname "${argocrds}")")")
k apply --server-side -f "${argocrds}/application-crd.yaml" -f "${argocrds}/applicationset-crd.yaml" \
  -f "${argocrds}/appproject-crd.yaml" >/dev/null
# (kubectl wait fails at once on a CRD that has no status yet, hence the retries.)
for _ in $(seq 30); do
  k wait --for condition=Established crd/applications.argoproj.io crd/applicationsets.argoproj.io \
    --timeout 10s >/dev/null 2>&1 && break
  sleep 1
done
k create namespace argocd >/dev/null
for f in "${root}"/examples/gitops/argocd/*.yaml; do
  if err=$(k apply --dry-run=server --server-side --field-manager=argocd -f "${f}" 2>&1 >/dev/null); then
    ok "${f#"${root}"/}: valid for Argo CD ${argover#*@} (server-side dry run)"
  else bad "${f#"${root}"/}: ${err}"; fi
done

# ---- 7. kube-state-metrics turns conditions into the series the alerts use ----------------
# The objects left above (the member's real status, the last API-shape status applied per
# name; ml/llama and "outside" were deleted in step 3) through kube-state-metrics with docs/monitoring/kube-state-metrics-flotilla.yaml.
ksm=$(bash "${here}/build-ksm.sh")
kport=$(free_port) ktport=$(free_port)
"${ksm}" --kubeconfig "${CKC}" --custom-resource-state-only \
  --custom-resource-state-config-file "${root}/docs/monitoring/kube-state-metrics-flotilla.yaml" \
  --host 127.0.0.1 --port "${kport}" --telemetry-host 127.0.0.1 --telemetry-port "${ktport}" \
  >"${FLOTILLA_E2E_DIR}/ksm.log" 2>&1 &
ksm_pid=$!
metrics=""
# Each kind's store fills on its own: wait for all four (up to 90 s on a loaded machine).
ksm_has_all() {
  local kind
  for kind in capacityclaim modelcache modeldeployment inferencecluster; do
    [[ "${metrics}" == *"flotilla_${kind}_condition{"* ]] || return 1
  done
}
for _ in $(seq 90); do
  metrics=$(curl -sf "http://127.0.0.1:${kport}/metrics" || true)
  ksm_has_all && break
  sleep 1
done
kill "${ksm_pid}" 2>/dev/null || true
wait "${ksm_pid}" 2>/dev/null || true
ksm_has_all || { bad "kube-state-metrics exposed not every kind within 90 s"; tail -n 5 "${FLOTILLA_E2E_DIR}/ksm.log"; }
# series NAME VALUE LABEL=VALUE...: some line of NAME has every label and the value.
series() {
  local name="$1" value="$2" line l hit=""
  shift 2
  while IFS= read -r line; do
    hit=1
    for l in "$@"; do [[ "${line}" == *"${l%%=*}=\"${l#*=}\""* ]] || { hit=""; break; }; done
    [[ -n "${hit}" && "${line##* }" == "${value}" ]] && break
    hit=""
  done < <(grep "^${name}{" <<<"${metrics}")
  if [[ -n "${hit}" ]]; then ok "kube-state-metrics: ${name}{$*} ${value}"
  else bad "kube-state-metrics: no ${name}{$*} ${value}"; grep "^${name}" <<<"${metrics}" | head -n 5 || true; fi
}
series flotilla_modeldeployment_condition 1 name=llama-ready namespace=ml type=Ready reason=AllReplicasReady
series flotilla_modeldeployment_ready_replicas 1 name=llama-ready namespace=ml
series flotilla_modeldeployment_condition 0 name=llama-ready type=Serving reason=AllEndpointsEjected
series flotilla_inferencecluster_condition 1 name=member type=Reachable reason=AsExpected
series flotilla_inferencecluster_condition 1 name=member type=CapacityKnown reason=AsExpected
series flotilla_inferencecluster_devices_total 8 name=member pool=h100 class=h100
series flotilla_capacityclaim_condition 0 name=llama-405b-launch type=Fulfilled reason=QuotaExceeded
series flotilla_modelcache_condition 1 name=llama-3.3-70b type=Ready reason=AsExpected

# ---- 8. every toggle on: the `full` snapshot against the real schemas ------------------------
# ServiceMonitor and PrometheusRule need prometheus-operator's CRDs; the rest (HPA, PDB,
# NetworkPolicy, Roles in a second namespace, ...) is checked by the API server itself.
promcrds=$(bash "${here}/prometheus-operator-crds.sh")
k apply --server-side -f "${promcrds}/monitoring.coreos.com_servicemonitors.yaml" \
  -f "${promcrds}/monitoring.coreos.com_prometheusrules.yaml" >/dev/null
for _ in $(seq 30); do
  k wait --for condition=Established crd/servicemonitors.monitoring.coreos.com \
    crd/prometheusrules.monitoring.coreos.com --timeout 10s >/dev/null 2>&1 && break
  sleep 1
done
k create namespace fleet-credentials >/dev/null
k create namespace fleet-api-keys >/dev/null
k create namespace team-a >/dev/null  # the values' second tenant namespace (its Secret-read Role)
if err=$(k apply --dry-run=server --server-side --field-manager=helm -f "${here}/snapshots/full.yaml" 2>&1 >/dev/null); then
  ok "snapshots/full.yaml ($(grep -c '^kind:' "${here}/snapshots/full.yaml") objects incl. ServiceMonitor, PrometheusRule, HPA, NetworkPolicy): accepted (server-side dry run)"
else bad "snapshots/full.yaml refused: ${err}"; fi
# (Same names as the installed release: --force-conflicts, harmless in a dry run.)
if err=$(k apply --dry-run=server --server-side --force-conflicts --field-manager=helm -f "${here}/snapshots/gateway-file.yaml" 2>&1 >/dev/null); then
  ok "snapshots/gateway-file.yaml (routing and keys from files): accepted (server-side dry run)"
else bad "snapshots/gateway-file.yaml refused: ${err}"; fi

# ---- 9. dashboard and alerts use only what the binaries export; chart routing loads --------
# Metric names as the real processes expose them: the controller above, kube-state-metrics
# above, and the gateway after one streamed request that fails over from a dead cluster to a
# fallback model served by the engine simulator (which touches all eight gateway families).
GATEWAY_BIN="${FLOTILLA_GATEWAY_BIN:-$(dirname "${CONTROLLER_BIN}")/flotilla-gateway}"
ENGINESIM_BIN="${FLOTILLA_ENGINESIM_BIN:-$(dirname "${CONTROLLER_BIN}")/flotilla-enginesim}"
if [[ ! -s "${FLOTILLA_E2E_DIR}/controller.metrics" || ! -x "${GATEWAY_BIN}" || ! -x "${ENGINESIM_BIN}" ]]; then
  printf 'SKIP metric names of dashboard and alerts: needs %s, %s and the controller step\n' "${GATEWAY_BIN}" "${ENGINESIM_BIN}"
else
  gdir="${FLOTILLA_E2E_DIR}/gateway"
  mkdir -p "${gdir}"
  sport=$(free_port) gport=$(free_port)
  printf '%s\n' 'clusters:' \
    '  - {name: dead, url: "http://127.0.0.1:1", jurisdiction: EU}' \
    "  - {name: sim, url: \"http://127.0.0.1:${sport}\", jurisdiction: EU}" \
    'models:' \
    '  - {name: m, fallbacks: [m2], routes: [{cluster: dead}]}' \
    '  - {name: m2, routes: [{cluster: sim}]}' >"${gdir}/routing.yaml"
  "${ENGINESIM_BIN}" --listen "127.0.0.1:${sport}" --name sim --model m2 >"${gdir}/sim.log" 2>&1 &
  sim_pid=$!
  "${GATEWAY_BIN}" --config "${gdir}/routing.yaml" --listen "127.0.0.1:${gport}" --breaker-failures 1 --allow-anonymous >"${gdir}/gw.log" 2>&1 &
  gw_pid=$!
  for _ in $(seq 30); do curl -sf "http://127.0.0.1:${gport}/healthz" >/dev/null && break; sleep 0.2; done
  curl -s -N "http://127.0.0.1:${gport}/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}' >/dev/null || true
  curl -sf "http://127.0.0.1:${gport}/metrics" >"${gdir}/gateway.metrics" || true
  kill "${sim_pid}" "${gw_pid}" 2>/dev/null || true
  wait "${sim_pid}" "${gw_pid}" 2>/dev/null || true
  { cat "${FLOTILLA_E2E_DIR}/controller.metrics" "${gdir}/gateway.metrics"; echo "${metrics}"; } \
    | grep '^flotilla_' | sed 's/[{ ].*//' | sort -u >"${FLOTILLA_E2E_DIR}/known-metrics.txt"
  ok "$(wc -l <"${FLOTILLA_E2E_DIR}/known-metrics.txt") flotilla_* series names exported by controller, gateway, kube-state-metrics"
  if out=$("$(bash "${here}/build-rulecheck.sh")" -metrics "${FLOTILLA_E2E_DIR}/known-metrics.txt" \
      "${root}/charts/flotilla/dashboards/flotilla.json" "${root}/charts/flotilla/monitoring/prometheusrule-spec.yaml" \
      "${root}/docs/monitoring/prometheusrule-sovereign-example.yaml" 2>&1); then
    ok "dashboard and alert rules select only exported metrics"
  else bad "dashboard/alerts use metrics nobody exports:"; echo "${out}"; fi

  # The routing table of the file-mode values, as the chart renders it, loads in the gateway.
  "${HELM}" template flotilla "${root}/charts/flotilla" -f "${here}/values/gateway-file.yaml" \
    --show-only templates/gateway/configmap.yaml \
    | k create --dry-run=client -f - -o 'jsonpath={.data.routing\.yaml}' >"${gdir}/full-routing.yaml"
  "${GATEWAY_BIN}" --config "${gdir}/full-routing.yaml" --listen "127.0.0.1:${gport}" --allow-anonymous >"${gdir}/gw-full.log" 2>&1 &
  gw_pid=$!
  loaded=""
  for _ in $(seq 30); do
    if curl -sf "http://127.0.0.1:${gport}/v1/models" | grep -q llama-3.3-70b-instruct; then loaded=1; break; fi
    sleep 0.2
  done
  kill "${gw_pid}" 2>/dev/null || true
  wait "${gw_pid}" 2>/dev/null || true
  if [[ -n "${loaded}" ]]; then ok "gateway loads the routing table the chart renders from values/gateway-file.yaml"
  else bad "gateway did not load the chart's routing table: $(head -n 3 "${gdir}/gw-full.log")"; fi
fi

# ---- 4. upgrade and uninstall -----------------------------------------------------------
# As docs/operations.md says: the CRDs first, server-side (Helm does not upgrade crds/).
if err=$(k apply --server-side --force-conflicts -f "${root}/charts/flotilla/crds/" 2>&1 >/dev/null); then
  ok "CRDs re-applied server-side over Helm's install"
else bad "kubectl apply --server-side --force-conflicts -f charts/flotilla/crds/: ${err}"; fi
"${HELM}" upgrade flotilla "${root}/charts/flotilla" --kubeconfig "${CKC}" -n "${NS}" --reuse-values \
  --set controller.pollSeconds=30 --set controller.clusterProfiles.enabled=true --wait --timeout 120s >/dev/null
if k -n "${NS}" get deploy flotilla-controller -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q -- '--poll-seconds=30'; then
  ok "helm upgrade: controller args changed"
else bad "helm upgrade did not change the controller args"; fi
# ClusterProfiles, once enabled: read only.
for v in get list watch; do can "$C" yes "$v" clusterprofiles.multicluster.x-k8s.io -A; done
can "$C" no update clusterprofiles.multicluster.x-k8s.io -n fleet-system
can "$C" no patch clusterprofiles.multicluster.x-k8s.io --subresource=status -n fleet-system
"${HELM}" uninstall flotilla --kubeconfig "${CKC}" -n "${NS}" --wait >/dev/null
left=$(k get crd -o name | grep -c 'flotilla.dev' || true)
if [[ "${left}" == 6 ]] && ! k get clusterrole flotilla-controller >/dev/null 2>&1; then
  ok "helm uninstall: workloads and RBAC gone, the 6 CRDs (and so every fleet object) kept"
else bad "after uninstall: ${left} CRDs, clusterrole $(k get clusterrole flotilla-controller -o name 2>&1)"; fi

exit "${fail}"
