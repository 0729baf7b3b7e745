#!/usr/bin/env bash
# Fetch, once, the Gateway API's standard-channel CRDs (sigs.k8s.io/gateway-api, the version in
# versions.env) from the Go module proxy, and print the path of one YAML file holding the
# GatewayClass, Gateway, HTTPRoute and ReferenceGrant CRDs, cached under
#   ${FLOTILLA_CACHE}/gateway-api-<version>/standard.yaml
# The member data-path e2e test (controllers/tests/e2e_datapath.rs) installs them in members.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

v="${FLOTILLA_GATEWAY_API_VERSION}"
dir="${FLOTILLA_CACHE}/gateway-api-${v}"
out="${dir}/standard.yaml"
if [[ -s "${out}" ]]; then
  echo "${out}"
  exit 0
fi

command -v go >/dev/null || die "go is not on PATH (needed once, to download sigs.k8s.io/gateway-api)"
json=$(cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/gateway-api@${v}") \
  || die "go mod download sigs.k8s.io/gateway-api@${v} failed: ${json:-no output}"
mod_dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"${json}")
[[ -d "${mod_dir}" ]] || die "go mod download printed no Dir for sigs.k8s.io/gateway-api@${v}: ${json}"
mkdir -p "${dir}"
: >"${out}.tmp"
for kind in gatewayclasses gateways httproutes referencegrants; do
  src="${mod_dir}/config/crd/standard/gateway.networking.k8s.io_${kind}.yaml"
  [[ -s "${src}" ]] || die "sigs.k8s.io/gateway-api@${v} has no ${src#"${mod_dir}"/}"
  grep -q "^  name: ${kind}.gateway.networking.k8s.io$" "${src}" || die "${src} is not the ${kind} CRD"
  { echo "---"; cat "${src}"; } >>"${out}.tmp"
done
mv "${out}.tmp" "${out}"
log "gateway-api ${v}: standard CRDs fetched"
echo "${out}"
