#!/usr/bin/env bash
# Benchmarks (not tests) of flotilla-gateway against flotilla-enginesim, with wrk. Writes
# docs/benchmarks.md: the latency the gateway adds, throughput, and routing quality
# (prefix-cache hit rate and TTFT under prefix affinity vs least load vs round robin).
# Needs `wrk` (apt-get install wrk) and curl. Usage: scripts/gateway-bench.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR="${1:-10}"
OUT=docs/benchmarks.md
SECTION=$(mktemp)

cargo build --quiet --release --locked -p flotilla-gateway -p flotilla-enginesim
BIN="${CARGO_TARGET_DIR:-target}/release"
WORK="$(mktemp -d)"
PIDS=()
STARTS=0
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# start NAME CMD... : run CMD in the background, wait for "listening on URL", store URL in $WORK/NAME.url
start() {
  local name="$1" out u
  shift
  STARTS=$((STARTS + 1))
  out="$WORK/$name.$STARTS.out"
  "$@" >"$out" 2>/dev/null &
  PIDS+=($!)
  for _ in $(seq 100); do
    u="$(sed -n 's/^listening on //p' "$out" 2>/dev/null | head -1)"
    if [ -n "$u" ]; then
      echo "$u" >"$WORK/$name.url"
      return
    fi
    sleep 0.1
  done
  echo "$name did not start: $*" >&2
  exit 1
}
url() {
  local u
  u="$(cat "$WORK/$1.url")"
  [ -n "$u" ] || { echo "no URL for $1" >&2; exit 1; }
  echo "$u"
}
stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
}
table() { # table FILE CLUSTER... : model m routed to every given simulator
  {
    echo "clusters:"
    for c in "${@:2}"; do echo "  - {name: $c, url: \"$(url "$c")\", jurisdiction: EU, region: eu-central-1}"; done
    echo "models:"
    echo "  - name: m"
    echo "    routes:"
    for c in "${@:2}"; do echo "      - {cluster: $c}"; done
  } >"$1"
}
gateway() { # gateway ROUTING CLUSTER...
  table "$WORK/table.yaml" "${@:2}"
  start gw "$BIN/flotilla-gateway" --listen 127.0.0.1:0 --config "$WORK/table.yaml" --routing "$1" \
    --scrape-interval-ms 500 --max-concurrency 4096
}

cat >"$WORK/small.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"ping"}]}'
LUA
cat >"$WORK/prefixes.lua" <<'LUA'
math.randomseed(42)
local prefixes = {}
for i = 1, 24 do
  local words = {}
  for w = 1, 200 do words[w] = "ctx" .. i .. "w" .. w end
  prefixes[i] = "System prompt " .. i .. ": " .. table.concat(words, " ")
end
local n = 0
request = function()
  n = n + 1
  local body = '{"model":"m","max_tokens":4,"messages":[{"role":"system","content":"' .. prefixes[math.random(1, 24)]
    .. '"},{"role":"user","content":"question ' .. n .. '"}]}'
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"] = "application/json"}, body)
end
LUA

# wrkrun CONNS SCRIPT URL -> "req/s p50 p99"
wrkrun() {
  local out
  local threads=2
  [ "$1" -lt 2 ] && threads=1
  out="$(wrk -t"$threads" -c"$1" -d"${DUR}s" --latency -s "$2" "$3/v1/chat/completions")"
  local rps p50 p99
  rps="$(awk '/^Requests\/sec/ {print $2}' <<<"$out")"
  p50="$(awk '$1=="50%" {print $2}' <<<"$out")"
  p99="$(awk '$1=="99%" {print $2}' <<<"$out")"
  echo "$rps $p50 $p99"
}
metric_sum() { # metric_sum URL NAME
  curl -s "$1/metrics" | awk -v n="$2" 'index($0, n) == 1 { s += $NF } END { printf "%.3f", s }'
}

echo "== added latency and throughput" >&2
start sim1 "$BIN/flotilla-enginesim" --listen 127.0.0.1:0 --name sim1 --model m --ttft-ms 0 --itl-ms 0 --max-num-seqs 1024
start sim2 "$BIN/flotilla-enginesim" --listen 127.0.0.1:0 --name sim2 --model m --ttft-ms 0 --itl-ms 0 --max-num-seqs 1024
gateway least-load sim1 sim2
read -r d_rps d_p50 d_p99 <<<"$(wrkrun 1 "$WORK/small.lua" "$(url sim1)")"
read -r g_rps g_p50 g_p99 <<<"$(wrkrun 1 "$WORK/small.lua" "$(url gw)")"
read -r dt_rps dt_p50 dt_p99 <<<"$(wrkrun 64 "$WORK/small.lua" "$(url sim1)")"
read -r gt_rps gt_p50 gt_p99 <<<"$(wrkrun 64 "$WORK/small.lua" "$(url gw)")"
stop_all

declare -A RQ
for mode in prefix least-load round-robin; do
  echo "== routing quality: $mode" >&2
  for s in a b c; do
    start "$s" "$BIN/flotilla-enginesim" --listen 127.0.0.1:0 --name "$s" --model m --ttft-ms 5 --itl-ms 1 \
      --prefill-ms-per-block 2 --block-size 16 --cache-blocks 128 --max-num-seqs 8
  done
  gateway "$mode" a b c
  read -r rps p50 p99 <<<"$(wrkrun 16 "$WORK/prefixes.lua" "$(url gw)")"
  hits=0 queries=0 tsum=0 tcount=0
  for s in a b c; do
    hits=$(awk -v a="$hits" -v b="$(metric_sum "$(url "$s")" 'vllm:prefix_cache_hits_total')" 'BEGIN {print a + b}')
    queries=$(awk -v a="$queries" -v b="$(metric_sum "$(url "$s")" 'vllm:prefix_cache_queries_total')" 'BEGIN {print a + b}')
    tsum=$(awk -v a="$tsum" -v b="$(metric_sum "$(url "$s")" 'vllm:time_to_first_token_seconds_sum')" 'BEGIN {print a + b}')
    tcount=$(awk -v a="$tcount" -v b="$(metric_sum "$(url "$s")" 'vllm:time_to_first_token_seconds_count')" 'BEGIN {print a + b}')
  done
  rate=$(awk -v h="$hits" -v q="$queries" 'BEGIN { if (q > 0) printf "%.1f%%", 100 * h / q; else print "n/a" }')
  ttft=$(awk -v s="$tsum" -v c="$tcount" 'BEGIN { if (c > 0) printf "%.1f ms", 1000 * s / c; else print "n/a" }')
  RQ[$mode]="| \`$mode\` | $rate | $ttft | $rps | $p50 | $p99 |"
  stop_all
done

cat >"$SECTION" <<MD
# Gateway benchmarks

Benchmarks, not tests: numbers from one run of \`scripts/gateway-bench.sh $DUR\` (release
build, wrk, ${DUR} s per measurement) on $(nproc) cores, $(date -u +%Y-%m-%d). The load
generator, the gateway and the simulators share the machine, so absolute numbers are
conservative; compare rows, not machines.

## Added latency (1 connection, 1-token answers, simulator with zero TTFT)

| path | req/s | p50 | p99 |
| --- | --- | --- | --- |
| client → simulator | $d_rps | $d_p50 | $d_p99 |
| client → gateway → simulator | $g_rps | $g_p50 | $g_p99 |

The difference between the two rows is the gateway's cost per request: parsing and
validating the body, choosing a cluster, a second loopback hop and re-framing the answer.

## Throughput (64 connections, 2 simulators)

| path | req/s | p50 | p99 |
| --- | --- | --- | --- |
| client → simulator | $dt_rps | $dt_p50 | $dt_p99 |
| client → gateway → 2 simulators | $gt_rps | $gt_p50 | $gt_p99 |

## Routing quality (3 simulators, 24 system prompts of ~200 words, 16 connections)

Each simulator has a prefix cache of 128 blocks of 16 words, too small for all 24 prompts
(~13 blocks each) but large enough for a third of them; a cached block saves 2 ms of
simulated prefill. Hit rate is prefix-cache hit tokens / queried tokens summed over the
simulators; TTFT is the simulators' mean time to first token. Prefix affinity does not reach
100 %: the load bound (\`--load-factor 1.25\`) spills a hot prefix to another cluster when its
home is busy, which is the point of the bound.

| routing | prefix-cache hit rate | mean TTFT | req/s | p50 | p99 |
| --- | --- | --- | --- | --- | --- |
${RQ[prefix]}
${RQ[least-load]}
${RQ[round-robin]}
MD
# Replace only the gateway section of docs/benchmarks.md; other sections stay as they are.
python3 - "$OUT" "$SECTION" <<'PY'
import sys
out, section = sys.argv[1], open(sys.argv[2]).read().rstrip() + "\n"
begin, end = "<!-- gateway-bench:begin -->", "<!-- gateway-bench:end -->"
try:
    text = open(out).read()
except FileNotFoundError:
    text = "# Benchmarks\n"
block = f"{begin}\n{section}{end}\n"
if begin in text and end in text:
    text = text[: text.index(begin)] + block + text[text.index(end) + len(end) + 1 :]
else:
    text = text.rstrip() + "\n\n" + block
open(out, "w").write(text)
PY
rm -f "$SECTION"
echo "wrote the gateway section of $OUT" >&2
