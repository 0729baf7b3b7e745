#!/usr/bin/env bash
# A local Flotilla fleet, end to end and unattended (docs/quickstart.md shows its transcript):
# the e2e harness starts a control cluster and three members (eu-fra-1, eu-par-1, us-iad-1)
# with kwok GPU nodes; the CRDs go in; flotilla-controller and flotilla-gateway run locally;
# examples/fleet is applied; engine simulators play each member's inference entry point.
# Then: `kubectl get` shows placements and conditions, a request goes through the one
# OpenAI-compatible endpoint, eu-fra-1 is stopped, and the EU-only model fails over to
# eu-par-1 (never to the US) while the status says so. Everything is torn down at the end.
# With FLOTILLA_DEMO_KEEP=1 the whole fleet keeps running instead — clusters, controller,
# gateway, simulators, with eu-fra-1 started again — and the demo prints how to reach it.
#
#   bash scripts/demo.sh               # under a minute on a warm cache
#   bash scripts/demo.sh --write-docs  # and put its transcript into docs/quickstart.md
#   bash scripts/demo.sh --check-docs  # and fail if docs/quickstart.md shows other steps (the tests)
#   bash scripts/demo.sh --check-kept  # a fleet kept by FLOTILLA_DEMO_KEEP=1 runs and answers
#   bash scripts/demo.sh --stop        # stop a kept fleet, and check that nothing of it runs
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

export FLOTILLA_E2E_DIR="${FLOTILLA_DEMO_DIR:-${TMPDIR:-/tmp}/flotilla-demo}"
HARNESS=tests/e2e/harness
TARGET="${CARGO_TARGET_DIR:-target}/debug"
MEMBERS=(eu-fra-1 eu-par-1 us-iad-1)

say() { printf '\n# %s\n' "$*"; }
# Show a command as typed, then its output.
run() {
  printf '$ %s\n' "$*" | sed -e "s#${BIN}/##g" -e "s#${FLOTILLA_E2E_DIR}#\$DEMO#g"
  "$@" 2>&1 | sed -e "s#${FLOTILLA_E2E_DIR}#\$DEMO#g"
}
kc() { "${BIN}/kubectl" --kubeconfig "${FLOTILLA_E2E_DIR}/control.kubeconfig" "$@"; }
kubectl() { kc "$@"; }  # what the transcript shows as `kubectl`

LOGS="${FLOTILLA_E2E_DIR}/logs"
PIDFILE="${LOGS}/pids"  # every process the demo starts besides the clusters

# Stops the demo's processes and its clusters.
teardown() {
  [[ -f "${PIDFILE}" ]] && while read -r p; do kill "$p" 2>/dev/null || true; done <"${PIDFILE}"
  bash "${HARNESS}/down.sh" >/dev/null 2>&1 || true
}

cleanup() {
  local rc=$?
  if [[ -n "${FLOTILLA_DEMO_KEEP:-}" ]]; then
    (( rc == 0 )) || echo "FLOTILLA_DEMO_KEEP: the demo failed; what it started is left running (logs in ${LOGS}; stop it: bash scripts/demo.sh --stop)"
  else
    teardown
  fi
  exit "$rc"
}

if [[ "${1:-}" == "--stop" ]]; then
  pids=()
  [[ -f "${PIDFILE}" ]] && mapfile -t pids <"${PIDFILE}"
  teardown
  alive=()
  for _ in $(seq 1 50); do
    alive=()
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
    (( ${#alive[@]} == 0 )) && break
    sleep 0.2
  done
  left=$(pgrep -f -- "${FLOTILLA_E2E_DIR}/" | tr '\n' ' ' || true)
  if (( ${#alive[@]} > 0 )) || [[ -n "${left}" ]]; then
    echo "demo --stop: still running: ${alive[*]} ${left}" >&2
    exit 1
  fi
  echo "the demo fleet in ${FLOTILLA_E2E_DIR} is stopped"
  exit 0
fi

if [[ "${1:-}" == "--check-kept" ]]; then
  BIN=$(bash "${HARNESS}/build.sh" 2>/dev/null)
  GW=$(cat "${LOGS}/endpoint")
  fail() { echo "demo --check-kept: $*" >&2; exit 1; }
  while read -r p; do kill -0 "$p" 2>/dev/null || fail "process $p the demo started is gone"; done <"${PIDFILE}"
  [[ "$(kc get inferencecluster eu-fra-1 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]] ||
    fail "eu-fra-1 is not Ready again"
  code=$(curl -s -o "${LOGS}/kept-answer.json" -w '%{http_code}' "${GW}/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model":"llama-3.3-70b-instruct","messages":[{"role":"user","content":"still there?"}],"max_tokens":4}')
  [[ "${code}" == 200 ]] || fail "the kept gateway answered ${code}: $(cat "${LOGS}/kept-answer.json")"
  echo "the kept demo fleet runs: $(wc -l <"${PIDFILE}") processes, eu-fra-1 Ready, ${GW} answers"
  exit 0
fi

trap cleanup EXIT

# A background process that prints `listening on http://ADDR` first: echo ADDR.
start_listener() {
  local log="$1"
  shift
  "$@" >"${log}" 2>"${log}.err" &
  echo $! >>"${PIDFILE}"
  local i
  for i in $(seq 1 100); do
    if grep -q '^listening on ' "${log}" 2>/dev/null; then
      sed -n 's/^listening on //p' "${log}" | head -n1
      return 0
    fi
    sleep 0.1
  done
  echo "demo: $* did not start; see ${log}.err" >&2
  return 1
}

wait_until() {
  local what="$1" timeout="$2"
  shift 2
  local deadline=$(( $(date +%s) + timeout ))
  until "$@" >/dev/null 2>&1; do
    (( $(date +%s) < deadline )) || { echo "demo: timed out waiting for ${what}" >&2; return 1; }
    sleep 1
  done
}

# Under scripts/test.sh the binaries were built by `cargo test --workspace` (FLOTILLA_PREBUILT).
[[ -n "${FLOTILLA_PREBUILT:-}" ]] ||
  cargo build -q --locked -p flotilla-controllers --bin flotilla-controller -p flotilla-gateway -p flotilla-enginesim
BIN=$(bash "${HARNESS}/build.sh")
mkdir -p "${FLOTILLA_E2E_DIR}"
bash "${HARNESS}/down.sh" >/dev/null 2>&1 || true
mkdir -p "${LOGS}"
: >"${PIDFILE}"
if [[ "${1:-}" == "--write-docs" || "${1:-}" == "--check-docs" ]]; then
  exec > >(tee "${LOGS}/transcript.txt")
fi

say "1. A control cluster and three members (etcd + kube-apiserver + scheduler + kwok each)"
bash "${HARNESS}/up.sh" control "${MEMBERS[@]}" >/dev/null
bash "${HARNESS}/gpu-nodes.sh" "${FLOTILLA_E2E_DIR}/eu-fra-1.kubeconfig" h100 --count 2 --pool h100 --region eu-central-1 2>/dev/null
bash "${HARNESS}/gpu-nodes.sh" "${FLOTILLA_E2E_DIR}/eu-fra-1.kubeconfig" l40s --count 2 --pool l40s --region eu-central-1 --capacity-type spot 2>/dev/null
bash "${HARNESS}/gpu-nodes.sh" "${FLOTILLA_E2E_DIR}/eu-par-1.kubeconfig" h100 --count 2 --pool h100 --region eu-west-3 2>/dev/null
bash "${HARNESS}/gpu-nodes.sh" "${FLOTILLA_E2E_DIR}/eu-par-1.kubeconfig" a100 --count 2 --pool a100 --region eu-west-3 2>/dev/null
bash "${HARNESS}/gpu-nodes.sh" "${FLOTILLA_E2E_DIR}/us-iad-1.kubeconfig" h100 --count 2 --pool h100 --region us-east-1 2>/dev/null
bash "${HARNESS}/gpu-nodes.sh" "${FLOTILLA_E2E_DIR}/us-iad-1.kubeconfig" l40s --count 2 --pool l40s --region us-east-1 --capacity-type spot 2>/dev/null
for m in "${MEMBERS[@]}"; do
  run "${BIN}/kubectl" --kubeconfig "${FLOTILLA_E2E_DIR}/${m}.kubeconfig" get nodes -L flotilla.dev/pool,nvidia.com/gpu.product
done

say "2. The CRDs, the member credentials, and examples/fleet on the control cluster"
run kubectl apply --server-side -f charts/flotilla/crds
wait_until "CRDs established" 60 kc wait --for condition=established --timeout=5s crd/modeldeployments.flotilla.dev
kc create namespace flotilla-system >/dev/null
kc create namespace flotilla-system-members >/dev/null  # the kubeconfigs' own namespace, as the chart's default
for m in "${MEMBERS[@]}"; do
  kc -n flotilla-system-members create secret generic "${m}-kubeconfig" --from-file=kubeconfig="${FLOTILLA_E2E_DIR}/${m}.kubeconfig" >/dev/null
done
run kubectl apply --server-side -f examples/fleet/namespace.yaml
run kubectl apply --server-side -R -f examples/fleet

say "3. Engine simulators as each member's inference entry point (an http:// in-cluster URL in a real fleet)"
MODELS=(--model llama-3.3-70b-instruct --model llama-3.1-8b-instruct --model gpt-oss-120b --model qwen3-235b-a22b-instruct --model llama-3.1-405b-instruct)
for m in "${MEMBERS[@]}"; do
  url=$(start_listener "${LOGS}/sim-${m}.log" "${TARGET}/flotilla-enginesim" --listen 127.0.0.1:0 --name "${m}" "${MODELS[@]}" --ttft-ms 5 --itl-ms 1)
  declare "SIM_${m//-/_}=${url}"
  kc patch inferencecluster "${m}" --type merge -p "{\"spec\":{\"endpoint\":\"${url}\"}}" >/dev/null
  echo "${m}: ${url}"
done

say "4. flotilla-controller and flotilla-gateway, run locally against the control cluster"
"${TARGET}/flotilla-controller" --kubeconfig "${FLOTILLA_E2E_DIR}/control.kubeconfig" --probe-addr 127.0.0.1:0 \
  --identity demo --poll-seconds 3 --member-timeout-seconds 8 >"${LOGS}/controller.log" 2>&1 &
echo $! >>"${PIDFILE}"
GW=$(start_listener "${LOGS}/gateway.log" "${TARGET}/flotilla-gateway" --control-cluster \
  --kubeconfig "${FLOTILLA_E2E_DIR}/control.kubeconfig" --listen 127.0.0.1:0 --feedback-interval-ms 2000 \
  --breaker-failures 3 --connect-timeout-ms 300 --allow-anonymous)
echo "gateway: ${GW}"
echo "${GW}" >"${LOGS}/endpoint"
waiting_70b() { kc -n ml get modeldeployment llama-3.3-70b-eu -o jsonpath='{.status.conditions[?(@.type=="WaitingForCache")].status}' | grep -qx True; }
wait_until "llama-3.3-70b-eu waiting for its cache" 120 waiting_70b
staged() { kc -n ml get modelcache llama-3.3-70b -o jsonpath='{.status.clusters[*].phase}' | grep -q .; }
wait_until "the cache's per-cluster phases" 60 staged

say "5. What Flotilla observed and decided"
run kubectl get inferenceclusters
run kubectl get modelcaches -n ml
run kubectl get modeldeployment llama-3.3-70b-eu -n ml -o jsonpath='{.status.conditions[?(@.type=="WaitingForCache")].message}{"\n"}'
echo "(kwok runs no containers, so the staging Jobs cannot download weights here, and the hf-token"
echo " Secret the caches name does not exist: the 70B model's replicas wait. Serve it without its cache:)"
run kubectl patch modeldeployment llama-3.3-70b-eu -n ml --type json -p '[{"op":"remove","path":"/spec/model/cacheRef"}]'
ready_70b() { kc -n ml get modeldeployment llama-3.3-70b-eu -o jsonpath='{.status.conditions[?(@.type=="Serving")].reason}' | grep -qx Routable; }
wait_until "llama-3.3-70b-eu routable" 120 ready_70b
sleep 5  # let the other deployments' first replicas report
run kubectl get modeldeployments -n ml
run kubectl get modeldeployment llama-3.3-70b-eu -n ml -o jsonpath='{range .status.placements[*]}{.cluster}{" "}{.class}{" ready="}{.ready}{"\n"}{end}'

say "6. One OpenAI-compatible endpoint for the fleet"
run curl -s "${GW}/v1/models" -o /dev/null -w '%{http_code}\n'
chat() {
  curl -s -D - -o "${LOGS}/answer.json" "${GW}/v1/chat/completions" -H 'content-type: application/json' \
    -d "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"Where am I served?\"}],\"max_tokens\":8}" \
    | grep -i -E '^(HTTP|x-flotilla-cluster)' | tr -d '\r'
}
run chat llama-3.3-70b-instruct

say "7. Failover: stop eu-fra-1 (its API server and its entry point); the EU-only model stays in the EU"
bash "${HARNESS}/stop.sh" eu-fra-1 2>/dev/null
fra_sim=$(sed -n 1p "${PIDFILE}")  # the first listener started: eu-fra-1's simulator
kill "${fra_sim}" 2>/dev/null || true
sed -i "/^${fra_sim}\$/d" "${PIDFILE}"
for i in 1 2 3 4 5 6; do run chat llama-3.3-70b-instruct; done | tee "${LOGS}/failover.txt"
moved() { kc -n ml get modeldeployment llama-3.3-70b-eu -o jsonpath='{.status.conditions[?(@.type=="Serving")].message}' | grep -v eu-fra-1 | grep -q eu-par-1; }
wait_until "the 70B model re-routed away from eu-fra-1" 120 moved
run kubectl get inferenceclusters eu-fra-1 eu-par-1 us-iad-1
run kubectl get modeldeployment llama-3.3-70b-eu -n ml -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}'
ok=$(grep -c '^HTTP/1.1 200' "${LOGS}/failover.txt" || true)
us=$(grep -ci '^x-flotilla-cluster: us-' "${LOGS}/failover.txt" || true)
echo "during the failover: ${ok} of 6 requests answered 200, ${us} served outside the EU"
[[ "${ok}" == 6 && "${us}" == 0 ]]
echo "demo finished"
if [[ "${1:-}" == "--check-docs" ]]; then
  sleep 0.5  # let tee finish
  # The transcript in docs/quickstart.md must show what this run showed: the same steps,
  # commands, tables (their columns and the objects in their first column) and applied objects.
  # Values that depend on timing (AGE, READY counts, messages, which cluster answered) are not
  # compared.
  python3 - "${LOGS}/transcript.txt" docs/quickstart.md <<'PY'
import difflib, re, sys
def shape(text):
    text = re.sub(r"http://127\.0\.0\.1:\d+", "http://127.0.0.1:PORT", text)
    out, table = [], False
    for line in text.splitlines():
        if line.startswith("# ") or line.startswith("$ "):
            out.append(line); table = False
        elif line.startswith("NAME "):
            out.append("table: " + " ".join(line.split())); table = True
        elif table and line.strip():
            out.append("  row: " + line.split()[0])
        elif re.match(r"^[a-z0-9.-]+/[A-Za-z0-9._-]+ (serverside-applied|patched|created|configured|deleted)$", line):
            out.append(line)
        else:
            table = False
    return out
run = shape(open(sys.argv[1]).read())
doc = open(sys.argv[2]).read()
doc = doc.split("<!-- demo:begin -->", 1)[1].split("<!-- demo:end -->", 1)[0]
documented = shape(doc)
if run != documented:
    sys.stderr.write("docs/quickstart.md's transcript no longer matches the demo (- documented, + this run):\n")
    sys.stderr.writelines(l + "\n" for l in difflib.unified_diff(documented, run, lineterm="", n=1))
    sys.stderr.write("refresh it: bash scripts/demo.sh --write-docs\n")
    sys.exit(1)
print(f"docs/quickstart.md: the transcript matches this run ({len(run)} steps, commands, tables and objects)")
PY
fi
if [[ "${1:-}" == "--write-docs" ]]; then
  exec >&2
  sleep 0.5  # let tee finish
  python3 - "${LOGS}/transcript.txt" docs/quickstart.md <<'PY'
import re, sys
text = open(sys.argv[1]).read()
text = re.sub(r"http://127\.0\.0\.1:\d+", "http://127.0.0.1:PORT", text).strip("\n")
doc = open(sys.argv[2]).read()
begin, end = "<!-- demo:begin -->\n", "<!-- demo:end -->"
head, rest = doc.split(begin, 1)
tail = rest.split(end, 1)[1]
open(sys.argv[2], "w").write(head + begin + "```text\n" + text + "\n```\n" + end + tail)
PY
  echo "docs/quickstart.md updated" >&2
fi
if [[ -n "${FLOTILLA_DEMO_KEEP:-}" ]]; then
  # Kept: the whole fleet, eu-fra-1 included (started again, with a new entry point).
  exec >&2
  bash "${HARNESS}/start.sh" eu-fra-1 >/dev/null 2>&1
  url=$(start_listener "${LOGS}/sim-eu-fra-1-again.log" "${TARGET}/flotilla-enginesim" --listen 127.0.0.1:0 --name eu-fra-1 "${MODELS[@]}" --ttft-ms 5 --itl-ms 1)
  kc patch inferencecluster eu-fra-1 --type merge -p "{\"spec\":{\"endpoint\":\"${url}\"}}" >/dev/null
  fra_ready() { kc get inferencecluster eu-fra-1 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }
  wait_until "eu-fra-1 Ready again" 120 fra_ready
  cat <<EOF

FLOTILLA_DEMO_KEEP: the fleet keeps running (eu-fra-1 started again).
  the endpoint:       curl ${GW}/v1/models
  the control plane:  kubectl --kubeconfig ${FLOTILLA_E2E_DIR}/control.kubeconfig get modeldeployments -n ml
  members:            ${FLOTILLA_E2E_DIR}/{eu-fra-1,eu-par-1,us-iad-1}.kubeconfig
  logs:               ${LOGS}
  stop it:            bash scripts/demo.sh --stop
EOF
fi
