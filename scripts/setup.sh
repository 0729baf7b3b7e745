#!/usr/bin/env bash
# Installs what the README's commands need on a fresh machine and is a no-op when it is all
# there: the Rust components (rustfmt, clippy), redis-server (Debian package; the gateway's shared
# limits tests in gateway/tests/shared_limits.rs start their own on a free loopback port), umoci
# (Debian package; the image tests). Later
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

# Debian packages, each installed once; the package lists are refreshed only when the install
# fails without them.
need_deb() { # package command
  command -v "$2" >/dev/null 2>&1 && return
  echo "setup: installing $1 (Debian package)"
  local sudo_=""
  [[ $(id -u) -eq 0 ]] || sudo_="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_ apt-get install -y -qq "$1" >/dev/null ||
    { $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq "$1" >/dev/null; }
  command -v "$2" >/dev/null || { echo "setup: $2 is still missing after apt-get install $1" >&2; exit 1; }
}
# redis-server: the package's own service is not started where policy-rc.d forbids it
# (containers); the tests never use it, they run their own servers.
need_deb redis-server redis-server
# umoci: tests/images/run.sh unpacks the built images with it.
need_deb umoci umoci
"$(dirname "$0")/setup-moto.sh"
