#!/usr/bin/env bash
# Benchmark (not a test) of flotilla-gateway in front of a real engine: llama.cpp's
# `llama-server` (scripts/build-llama-server.sh, cached) and the tiny test model, the gateway's
# added latency and CPU per request beside direct requests in the same run
# (scripts/gateway-bench-llama.py). Writes its section of docs/benchmarks.md (between the
# gateway-llama-bench markers). About a minute once the binaries are built.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=docs/benchmarks.md
BENCH_NAME=gateway-llama-bench
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
CACHE="${FLOTILLA_CACHE:-$HOME/.cache/flotilla}"
VENV="$CACHE/venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
cmp -s tests/gateway/requirements.txt "$VENV/.gateway-requirements.txt" || {
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r tests/gateway/requirements.txt
  cp tests/gateway/requirements.txt "$VENV/.gateway-requirements.txt"
}
cargo build --quiet --release --locked -p flotilla-gateway
export FLOTILLA_GATEWAY_BIN="${CARGO_TARGET_DIR:-target}/release/flotilla-gateway"
FLOTILLA_LLAMA_SERVER_BIN="$(bash scripts/build-llama-server.sh)"
export FLOTILLA_LLAMA_SERVER_BIN
"$VENV/bin/python" scripts/gateway-bench-llama.py >"$WORK/section.md"
cat "$WORK/section.md"
write_section "$OUT" gateway-llama-bench "$WORK/section.md" gateway-nginx-bench
