#!/usr/bin/env bash
# The gateway's openai-client tests: a venv with the pinned official `openai` SDK and pytest
# (created once under ${FLOTILLA_CACHE:-~/.cache/flotilla}/venv, re-installed only when
# tests/gateway/requirements.txt changes), the gateway and simulator binaries, llama.cpp's
# llama-server for tests/gateway/test_real_engine.py (scripts/build-llama-server.sh: cached, and
# under scripts/test.sh already built beside the Rust build), then pytest.
# Arguments go to pytest (none: every test under tests/gateway; a file or node id: only that).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
VENV="$CACHE/venv"
REQ=tests/gateway/requirements.txt
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! cmp -s "$REQ" "$VENV/.gateway-requirements.txt"; then
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ"
  cp "$REQ" "$VENV/.gateway-requirements.txt"
fi

# Under scripts/test.sh the binaries were built by `cargo test --workspace` (FLOTILLA_PREBUILT).
[[ -n "${FLOTILLA_PREBUILT:-}" ]] || cargo build --quiet --locked -p flotilla-gateway -p flotilla-enginesim
TARGET="${CARGO_TARGET_DIR:-target}"
export FLOTILLA_GATEWAY_BIN="$TARGET/debug/flotilla-gateway"
export FLOTILLA_ENGINESIM_BIN="$TARGET/debug/flotilla-enginesim"
FLOTILLA_LLAMA_SERVER_BIN="$(bash scripts/build-llama-server.sh)"
export FLOTILLA_LLAMA_SERVER_BIN
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${@:-tests/gateway}"
