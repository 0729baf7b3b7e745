#!/usr/bin/env bash
# Prints the directory holding prometheus-operator's CRDs (ServiceMonitor, PrometheusRule, ...),
# from its Go module through the module proxy (a 4 MB download once, then cached in
# GOMODCACHE). install-test.sh installs ServiceMonitor and PrometheusRule to dry-run the
# chart's `full` snapshot against their real schemas.
set -euo pipefail
FLOTILLA_PROMETHEUS_OPERATOR_VERSION="${FLOTILLA_PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
dir=$(GOTOOLCHAIN=local go mod download -json "github.com/prometheus-operator/prometheus-operator@${FLOTILLA_PROMETHEUS_OPERATOR_VERSION}" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
crds="${dir}/example/prometheus-operator-crd"
[[ -f "${crds}/monitoring.coreos.com_servicemonitors.yaml" ]] || { echo "prometheus-operator-crds: no CRDs in ${dir:-the module}" >&2; exit 1; }
echo "${crds}"
