#!/usr/bin/env bash
# Installs what the README's commands need on a fresh machine and is a no-op when it is all
# there: the Rust components (rustfmt, clippy), redis-server (Debian package; the gateway's shared
# limits tests in gateway/tests/shared_limits.rs start their own on a free loopback port). Later
# tiers (Kubernetes binaries for the e2e harness, Python packages) add their steps here and cache
# under ${FLOTILLA_CACHE}.
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

# redis-server from Debian's packages; the package lists are refreshed only when the install
# fails without it. The package's own service is not started where policy-rc.d forbids it
# (containers); the tests never use it, they run their own servers.
if ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: installing redis-server (Debian package)"
  sudo_=""
  [[ $(id -u) -eq 0 ]] || sudo_="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_ apt-get install -y -qq redis-server >/dev/null ||
    { $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq redis-server >/dev/null; }
  command -v redis-server >/dev/null || { echo "setup: redis-server is still missing after apt-get install" >&2; exit 1; }
fi
"$(dirname "$0")/setup-moto.sh"
