#!/usr/bin/env bash
# Installs the Lua interpreters the Argo CD health tests run under, from Debian, once:
#   lua5.1  the language Argo CD's embedded interpreter (gopher-lua) implements;
#   lua5.4  the current Lua, to catch code that only works by accident in 5.1.
# A no-op (milliseconds) when both are on PATH. Needs apt-get (and root, or sudo) only the
# first time.
set -euo pipefail
missing=()
for lua in lua5.1 lua5.4; do
  command -v "${lua}" >/dev/null || missing+=("${lua}")
done
((${#missing[@]} == 0)) && exit 0
echo "setup-lua: installing ${missing[*]} (apt-get)" >&2
sudo=()
[[ "$(id -u)" == 0 ]] || sudo=(sudo)
# Refresh the package lists only when the install cannot find the packages.
if ! DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
  "${sudo[@]}" apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
for lua in "${missing[@]}"; do command -v "${lua}" >/dev/null || { echo "setup-lua: ${lua} still missing" >&2; exit 1; }; done
