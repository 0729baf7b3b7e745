#!/usr/bin/env bash
# Fetch, once, the ClusterProfile CRD of SIG Multicluster's Cluster Inventory API
# (clusterprofiles.multicluster.x-k8s.io) from its published Go module
# sigs.k8s.io/cluster-inventory-api@${FLOTILLA_CLUSTER_INVENTORY_VERSION} (versions.env), through
# the Go module proxy: `go mod download -json` prints the module's Dir, which holds the CRD as
# controller-gen wrote it under config/crd/bases. The file is copied to
#   ${FLOTILLA_CACHE:-$HOME/.cache/flotilla}/cluster-inventory-api-<v>/multicluster.x-k8s.io_clusterprofiles.yaml
# and a second run only prints that path ("cached"). Nothing is built.
#
# Usage: cluster-inventory-crd.sh   (prints the CRD file's path on stdout)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

v="${FLOTILLA_CLUSTER_INVENTORY_VERSION}"
dir="${FLOTILLA_CACHE}/cluster-inventory-api-${v}"
crd="${dir}/multicluster.x-k8s.io_clusterprofiles.yaml"
if [[ -s "${crd}" ]]; then
  log "cluster-inventory-api ${v}: cached"
  echo "${crd}"
  exit 0
fi

command -v go >/dev/null || die "go is not on PATH (needed once, to download sigs.k8s.io/cluster-inventory-api)"
start=$(date +%s)
# Outside any module, with the machine's module cache: only a download, no build.
json=$(cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/cluster-inventory-api@${v}") \
  || die "go mod download sigs.k8s.io/cluster-inventory-api@${v} failed: ${json:-no output}"
mod_dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"${json}")
[[ -d "${mod_dir}" ]] || die "go mod download printed no Dir for sigs.k8s.io/cluster-inventory-api@${v}: ${json}"
src="${mod_dir}/config/crd/bases/multicluster.x-k8s.io_clusterprofiles.yaml"
[[ -s "${src}" ]] || die "sigs.k8s.io/cluster-inventory-api@${v} has no ${src#"${mod_dir}"/}"
grep -q '^  name: clusterprofiles.multicluster.x-k8s.io$' "${src}" \
  || die "${src} is not the ClusterProfile CRD"

mkdir -p "${dir}"
cp "${src}" "${crd}.tmp"
chmod 0644 "${crd}.tmp"
mv "${crd}.tmp" "${crd}"
log "cluster-inventory-api ${v}: CRD fetched in $(( $(date +%s) - start ))s"
echo "${crd}"
