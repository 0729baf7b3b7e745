#!/usr/bin/env bash
# Installs what the README's commands need on a fresh machine and is a no-op when it is all
# there: the Rust components (rustfmt, clippy). Later tiers (Kubernetes binaries for the e2e
# harness, Python packages) add their steps here and cache under ${FLOTILLA_CACHE}.
set -euo pipefail
export FLOTILLA_CACHE="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
mkdir -p "$FLOTILLA_CACHE"

need_component() {
  if ! cargo "$1" --version >/dev/null 2>&1; then
    echo "setup: installing rustup component $2"
    rustup component add "$2"
  fi
}
need_component fmt rustfmt
need_component clippy clippy
"$(dirname "$0")/setup-moto.sh"
