#!/usr/bin/env bash
# Start clusters stopped by stop.sh and wait until their API servers are ready again.
#   start.sh NAME...
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ $# -ge 1 ]] || die "usage: $0 NAME..."
require_binaries
kwok_env
for name in "$@"; do
  kwokctl start cluster --name "${name}" >&2 || die "could not start cluster ${name}"
  kc="${FLOTILLA_E2E_DIR}/${name}.kubeconfig"
  deadline=$(( $(date +%s) + ${FLOTILLA_E2E_TIMEOUT:-180} ))
  until kubectl --kubeconfig "${kc}" get --raw /readyz >/dev/null 2>&1; do
    (( $(date +%s) < deadline )) || die "cluster ${name} did not become ready after start"
    sleep 0.5
  done
  log "started ${name}"
done
