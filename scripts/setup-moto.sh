#!/usr/bin/env bash
# The AWS emulator for the `providers` AWS adapter tests: `moto[server]` pinned in
# tests/moto/requirements.txt, installed into the shared venv under
# ${FLOTILLA_CACHE:-~/.cache/flotilla}/venv (created once, re-installed only when the
# requirements change). The tests start `$VENV/bin/moto_server` themselves
# (override with FLOTILLA_MOTO_SERVER).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
VENV="$CACHE/venv"
REQ=tests/moto/requirements.txt
mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! cmp -s "$REQ" "$VENV/.moto-requirements.txt" || [ ! -x "$VENV/bin/moto_server" ]; then
  echo "setup: installing $(tr '\n' ' ' < "$REQ")into $VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ"
  cp "$REQ" "$VENV/.moto-requirements.txt"
fi
