#!/usr/bin/env bash
# Build, once, the helm CLI the chart tests use, from its Go module
# (helm.sh/helm/v3/cmd/helm), with CGO_ENABLED=0, into
#   ${FLOTILLA_CACHE:-$HOME/.cache/flotilla}/helm-<version>/bin/helm
# A binary that already exists is reused (a no-op taking milliseconds); a fresh
# build takes a few minutes on a 2-core machine. The Go module and build caches
# are the defaults, shared with every other Go build on the machine.
#
# Usage: build-helm.sh        (prints the path of the helm binary on stdout)
# Environment: FLOTILLA_HELM_VERSION (default below), FLOTILLA_CACHE.
set -euo pipefail

# v3.22.0: newest helm 3 release on the module proxy (2026-09); its go.mod says
# `go 1.26.0` and has no replace directives, so `go install ...@version` works.
FLOTILLA_HELM_VERSION="${FLOTILLA_HELM_VERSION:-v3.22.0}"
FLOTILLA_CACHE="${FLOTILLA_CACHE:-${HOME}/.cache/flotilla}"
dir="${FLOTILLA_CACHE}/helm-${FLOTILLA_HELM_VERSION}/bin"
helm="${dir}/helm"

if [[ ! -x "${helm}" ]]; then
  command -v go >/dev/null || { echo "build-helm: go is not on PATH (Go >= 1.26 is required)" >&2; exit 1; }
  mkdir -p "${dir}"
  start=$(date +%s)
  echo "build-helm: go install helm.sh/helm/v3/cmd/helm@${FLOTILLA_HELM_VERSION} (a few minutes, once)" >&2
  # Build into a temporary GOBIN and move, so that an interrupted build never
  # leaves a binary the cache check above would trust.
  tmp=$(mktemp -d "${dir}/.tmp.XXXXXX")
  trap 'rm -rf "${tmp}"' EXIT
  # Helm's Makefile stamps its version and the Kubernetes version `helm template` and `helm
  # lint` assume (else v1.20) with -X; do the same, taking the Kubernetes minor from the
  # k8s.io/client-go that this helm release requires (v0.37.0 -> 1.37).
  gomod=$(go mod download -json "helm.sh/helm/v3@${FLOTILLA_HELM_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  k8s_minor=$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "${gomod}" | head -n1)
  [[ -n "${k8s_minor}" ]] || { echo "build-helm: no k8s.io/client-go in ${gomod}" >&2; exit 1; }
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${FLOTILLA_HELM_VERSION}"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${k8s_minor}"
  done
  CGO_ENABLED=0 GOBIN="${tmp}" go install -trimpath -ldflags "${ldflags}" \
    "helm.sh/helm/v3/cmd/helm@${FLOTILLA_HELM_VERSION}"
  got=$("${tmp}/helm" version --template '{{.Version}}')
  [[ "${got}" == "${FLOTILLA_HELM_VERSION}" ]] || { echo "build-helm: built helm says ${got}" >&2; exit 1; }
  mv "${tmp}/helm" "${helm}"
  echo "build-helm: built in $(( $(date +%s) - start ))s" >&2
fi
echo "${helm}"
