#!/usr/bin/env bash
# The exact solver of the placement quality benchmark (scripts/solver-quality.sh): OR-Tools
# CP-SAT, pinned in scripts/quality/requirements.txt, installed into the shared venv under
# ${FLOTILLA_CACHE:-~/.cache/flotilla}/venv (created once, re-installed only when the
# requirements change).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
VENV="$CACHE/venv"
REQ=scripts/quality/requirements.txt
mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! cmp -s "$REQ" "$VENV/.quality-requirements.txt" || ! "$VENV/bin/python" -c 'import ortools' 2>/dev/null; then
  echo "setup: installing $(tr '\n' ' ' < "$REQ")into $VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ"
  cp "$REQ" "$VENV/.quality-requirements.txt"
fi
