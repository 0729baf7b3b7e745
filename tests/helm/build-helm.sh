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
  # The version is normally stamped from VCS info, which a module build lacks.
  CGO_ENABLED=0 GOBIN="${tmp}" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${FLOTILLA_HELM_VERSION}" \
    "helm.sh/helm/v3/cmd/helm@${FLOTILLA_HELM_VERSION}"
  mv "${tmp}/helm" "${helm}"
  echo "build-helm: built in $(( $(date +%s) - start ))s" >&2
fi
echo "${helm}"
