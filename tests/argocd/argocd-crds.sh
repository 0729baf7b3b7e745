#!/usr/bin/env bash
# Prints the directory holding Argo CD's own CRDs (Application, ApplicationSet, AppProject),
# taken from its Go module through the module proxy (go mod download; cached in GOMODCACHE,
# so a no-op after the first time). tests/helm/install-test.sh installs them into the harness
# control cluster to validate examples/gitops/argocd/*.yaml with server-side dry-run.
set -euo pipefail
FLOTILLA_ARGOCD_VERSION="${FLOTILLA_ARGOCD_VERSION:-v3.5.7}"   # newest Argo CD whose go.mod Go 1.26 accepts (v3.6 wants 1.27)
dir=$(GOTOOLCHAIN=local go mod download -json "github.com/argoproj/argo-cd/v3@${FLOTILLA_ARGOCD_VERSION}" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[[ -f "${dir}/manifests/crds/application-crd.yaml" ]] || { echo "argocd-crds: no CRDs in ${dir:-the module}" >&2; exit 1; }
echo "${dir}/manifests/crds"
