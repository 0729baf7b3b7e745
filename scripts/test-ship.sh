#!/usr/bin/env bash
# Shipping checks (issue #10): the Helm chart, the GitOps examples, the Argo CD health checks.
#   1. helm, kube-state-metrics and rulecheck (Prometheus' rule parser) built once from their Go
#      modules, cached; lua5.1/lua5.4 from Debian, once;
#   2. helm lint --strict + helm template snapshots for 6 value sets, 17 value files refused
#      (tests/helm/snapshots.sh);
#   3. the Argo CD health scripts against real and API-shape status fixtures under Lua 5.1 and
#      5.4, and the argocd-cm patch in sync with them (tests/argocd/run.sh);
#   3a. the controller, gateway and stage images built without a container engine, each run from
#       its own filesystem, rebuilt to the same digests, the chart rendered with those digests, and
#       the GitHub workflows linted (tests/images/run.sh);
#   3b. the PrometheusRule and the docs' example rule through Prometheus' rule parser;
#   4. fleetctl validate --strict on each environment of examples/gitops, as its CI workflow does;
#   5. helm install into a harness control cluster it starts and tears down, kubectl auth can-i
#      for both ServiceAccounts (the controller reads the member kubeconfig Secret, not Helm's
#      release Secret; it may patch InferenceClusters for their finalizer), the real controller and the real gateway (control-cluster mode)
#      under the chart's ServiceAccounts, fixture shapes against the CRDs, Argo CD manifests
#      against Argo CD's CRDs, kube-state-metrics condition series for the alerts, the
#      every-toggle snapshot against real schemas (ServiceMonitor, PrometheusRule from
#      prometheus-operator's CRDs), dashboard and rule metric names against what the real
#      binaries export, the chart's file-mode routing table loaded by the real gateway, a member
#      reached only through examples/member-rbac/, upgrade and uninstall
#      (tests/helm/install-test.sh).
# Idempotent; 35-85 s on a warm cache (docs/operations.md, "Testing the chart").
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
t=${start}
lap() { local now; now=$(date +%s); printf -- '--- %s: %d s\n' "$1" $((now - t)); t=${now}; }

HELM=$(bash tests/helm/build-helm.sh)
export HELM
bash tests/helm/build-ksm.sh >/dev/null
RULECHECK=$(bash tests/helm/build-rulecheck.sh)
bash tests/argocd/setup-lua.sh
lap "setup (helm $("${HELM}" version --template '{{.Version}}'), kube-state-metrics, rulecheck, lua5.1, lua5.4)"

bash tests/helm/snapshots.sh
lap "chart lint and template snapshots"

bash tests/argocd/run.sh
lap "Argo CD health checks"

bash tests/images/run.sh
lap "images: built, run from their own filesystems, reproducible; the chart with their digests; workflows linted"

"${RULECHECK}" charts/flotilla/monitoring/prometheusrule-spec.yaml docs/monitoring/prometheusrule-sovereign-example.yaml \
  charts/flotilla/dashboards/flotilla.json
lap "alert rules and dashboard queries through Prometheus' parsers"

for env in examples/gitops/fleets/*/; do
  cargo run -q --locked -p fleetctl -- validate -f "${env}" --strict
done
lap "fleetctl validate on examples/gitops"

bash tests/helm/install-test.sh 2>&1 | grep -v 'unrecognized format'
lap "helm install on a harness control cluster, RBAC, fixtures, Argo CD manifests, kube-state-metrics"

echo "test-ship: all passed in $(($(date +%s) - start)) s"
