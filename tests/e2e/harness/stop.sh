#!/usr/bin/env bash
# Stop the components of the named clusters (their API servers stop answering) without
# deleting them; start.sh brings them back with the same ports, certificates and data.
#   stop.sh NAME...
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ $# -ge 1 ]] || die "usage: $0 NAME..."
require_binaries
kwok_env
for name in "$@"; do
  kwokctl stop cluster --name "${name}" >&2 || die "could not stop cluster ${name}"
  log "stopped ${name}"
done
