#!/usr/bin/env bash
# Benchmark (not a test): the gateway's lean hot path side by side with nginx, on one machine
# in one run. nginx serves a fixed upstream (a static OpenAI chat completion; on a second port
# a static 16-token SSE stream) and, as a second nginx, a proxy hop in front of it (keepalive
# upstream connections); the gateway is put in front of the same upstream. wrk at 16 and 64
# connections measures throughput, and /proc/PID/stat (utime+stime, master and workers for
# nginx) the CPU each proxy spent per 1,000 requests. Then the cost of keeping a stream
# continuable: one connection, an uninterrupted 16-token stream, gateway with continuation on
# (the default) vs `--continuation false`. Writes the gateway-nginx section of
# docs/benchmarks.md (between its markers), after the gateway-bench section.
#
# Tools: nginx (`apt-get install nginx-light`), wrk, curl, python3; installed when missing
# unless GATEWAY_BENCH_NO_INSTALL=1. Usage: scripts/gateway-bench-nginx.sh [seconds per
# measurement, default 10] (about 3 minutes at 10). scripts/gateway-bench.sh runs it last.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR="${1:-10}"
OUT=docs/benchmarks.md
BENCH_NAME=gateway-bench-nginx
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
export PATH="$PATH:/usr/sbin"
need curl "apt-get install -y curl" apt_install curl
need python3 "apt-get install -y python3" apt_install python3
need wrk "apt-get install -y wrk" apt_install wrk
need nginx "apt-get install -y nginx-light" apt_install nginx-light

cargo build --quiet --release --locked -p flotilla-gateway -p flotilla-enginesim
BIN="${CARGO_TARGET_DIR:-target}/release"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The upstream's answers: what an engine would send, with nothing left for it to compute.
ANSWER='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
TOKENS=16
SSE=""
for i in $(seq "$TOKENS"); do
  delta="{\"content\":\"tok$i \"}" finish=null
  [ "$i" = 1 ] && delta="{\"role\":\"assistant\",\"content\":\"tok$i \"}"
  [ "$i" = "$TOKENS" ] && finish='"stop"'
  SSE+="data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"s\",\"choices\":[{\"index\":0,\"delta\":$delta,\"finish_reason\":$finish}]}\\n\\n"
done
SSE+="data: [DONE]\\n\\n"

UP=$(free_port) UP_SSE=$(free_port) HOP=$(free_port)
NGINX_COMMON="daemon off; worker_processes 2; $([ "$(id -u)" = 0 ] && echo 'user root;')
events { worker_connections 4096; }"
HTTP_COMMON="access_log off; keepalive_requests 1000000; keepalive_timeout 60s;"
nginx_start() { # nginx_start NAME CONF-TEXT CHECK-URL
  mkdir -p "$WORK/$1"
  printf '%s\n' "$2" >"$WORK/$1/nginx.conf"
  nginx -p "$WORK/$1" -e "$WORK/$1/error.log" -c "$WORK/$1/nginx.conf" &
  PIDS+=($!)
  echo $! >"$WORK/$1.pid"
  for _ in $(seq 100); do
    curl -sf -o /dev/null -X POST "$3" && return
    sleep 0.1
  done
  echo "nginx $1 did not start:" >&2
  cat "$WORK/$1/error.log" >&2
  exit 1
}
nginx_start upstream "$NGINX_COMMON
pid $WORK/upstream/nginx.pid;
http {
  $HTTP_COMMON
  server {
    listen 127.0.0.1:$UP;
    location = /v1/chat/completions { default_type application/json; return 200 '$ANSWER'; }
    location = /v1/models { default_type application/json; return 200 '{\"object\":\"list\",\"data\":[{\"id\":\"m\",\"object\":\"model\"}]}'; }
    location = /metrics { default_type text/plain; return 200 'vllm:num_requests_waiting 0\n'; }
  }
  server {
    listen 127.0.0.1:$UP_SSE;
    location = /v1/chat/completions { default_type text/event-stream; return 200 '$SSE'; }
    location = /v1/models { default_type application/json; return 200 '{\"object\":\"list\",\"data\":[{\"id\":\"s\",\"object\":\"model\"}]}'; }
    location = /metrics { default_type text/plain; return 200 'vllm:num_requests_waiting 0\n'; }
  }
}" "http://127.0.0.1:$UP/v1/chat/completions"
HOP_CONF="upstream engine { server 127.0.0.1:$UP; keepalive 128; keepalive_requests 1000000; }
server {
  listen 127.0.0.1:$HOP;
  location / { proxy_pass http://engine; proxy_http_version 1.1; proxy_set_header Connection \"\"; }
}"
nginx_start hop "$NGINX_COMMON
pid $WORK/hop/nginx.pid;
http {
  $HTTP_COMMON
  $HOP_CONF
}" "http://127.0.0.1:$HOP/v1/chat/completions"

cat >"$WORK/table.yaml" <<YAML
clusters:
  - {name: up, url: "http://127.0.0.1:$UP", jurisdiction: EU, region: eu-central-1}
  - {name: up-sse, url: "http://127.0.0.1:$UP_SSE", jurisdiction: EU, region: eu-central-1}
models:
  - {name: m, routes: [{cluster: up}]}
  - {name: s, routes: [{cluster: up-sse}]}
YAML
GW_FLAGS="--scrape-interval-ms 500 --max-concurrency 4096 --allow-anonymous"
# shellcheck disable=SC2086
start gw "$BIN/flotilla-gateway" --listen 127.0.0.1:0 --config "$WORK/table.yaml" $GW_FLAGS
# shellcheck disable=SC2086
start gw-nocont "$BIN/flotilla-gateway" --listen 127.0.0.1:0 --config "$WORK/table.yaml" $GW_FLAGS --continuation false

BODY='{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"ping"}]}'
SBODY="{\"model\":\"s\",\"max_tokens\":$TOKENS,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"ping\"}]}"
for f in plain:"$BODY" stream:"$SBODY"; do
  printf 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = %s\n' \
    "'${f#*:}'" >"$WORK/${f%%:*}.lua"
done
# Every path must answer in full before it is measured.
answers() { # answers URL BODY PATTERN
  local got
  got="$(curl -sf "$1/v1/chat/completions" -H 'content-type: application/json' -d "$2" || true)"
  [[ "$got" == *$3* ]] || { echo "$BENCH_NAME: $1 did not answer in full: $got" >&2; exit 1; }
}
for u in "http://127.0.0.1:$HOP" "$(url gw)"; do answers "$u" "$BODY" '"content":"ok"'; done
for u in "http://127.0.0.1:$UP_SSE" "$(url gw)" "$(url gw-nocont)"; do
  answers "$u" "$SBODY" "tok$TOKENS \"},\"finish_reason\":\"stop\"*data: \[DONE\]"
done

# wrkrun CONNS SCRIPT URL PID -> "req/s p50 p99 requests non2xx+errors cpu_ms_per_1k cpu_pct"
# (PID: the process tree whose CPU is counted; "-" for none)
wrkrun() {
  local conns="$1" threads=2 out before=0 after=0
  [ "$conns" -lt 2 ] && threads=1
  [ "$4" != - ] && before=$(tree_ticks "$4")
  out="$(wrk -t"$threads" -c"$conns" -d"${DUR}s" --latency -s "$2" "$3/v1/chat/completions")"
  [ "$4" != - ] && after=$(tree_ticks "$4")
  awk -v ticks=$((after - before)) -v tck="$TCK" -v track="$4" -v dur="$DUR" '
    /^Requests\/sec/ { rps = $2 }
    $1 == "50%" { p50 = $2 }
    $1 == "99%" { p99 = $2 }
    / requests in / { n = $1 }
    /Non-2xx or 3xx responses:/ { bad += $NF }
    /Socket errors:/ { for (i = 3; i <= NF; i += 2) { v = $(i + 1); gsub(/,/, "", v); bad += v } }
    END {
      cpu = (track == "-") ? "" : sprintf("%.1f", 1000 * 1000 * ticks / tck / n)
      pct = (track == "-") ? "" : sprintf("%.0f", 100 * ticks / tck / dur)
      printf "%.0f %s %s %d %d %s %s\n", rps, p50, p99, n, bad, (cpu == "" ? "-" : cpu), (pct == "" ? "-" : pct)
    }' <<<"$out"
}

LOAD_BEFORE=$(cut -d' ' -f1 /proc/loadavg)
ROWS="" ERRORS=0
declare -A RPS CPU
for c in 16 64; do
  for path in upstream hop gateway; do
    echo "== $path, $c connections" >&2
    case $path in
      upstream) target="http://127.0.0.1:$UP" pid=- ;;
      hop) target="http://127.0.0.1:$HOP" pid=$(cat "$WORK/hop.pid") ;;
      gateway) target="$(url gw)" pid=$(cat "$WORK/gw.pid") ;;
    esac
    read -r rps p50 p99 n bad cpu pct <<<"$(wrkrun "$c" "$WORK/plain.lua" "$target" "$pid")"
    RPS[$path$c]=$rps CPU[$path$c]=$cpu ERRORS=$((ERRORS + bad))
    label="client → nginx upstream"
    [ "$path" = hop ] && label="client → **nginx hop** → nginx upstream"
    [ "$path" = gateway ] && label="client → **gateway** → nginx upstream"
    [ "$pct" = - ] && pct="" || pct="$pct %"
    [ "$cpu" = - ] && cpu=""
    ROWS+="| $c | $label | $rps | $p50 | $p99 | $n | $bad | $pct | $cpu |"$'\n'
  done
done

us() { # wrk's "69.00us" / "1.20ms" -> microseconds
  awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /ms$/) n *= 1000; else if (v ~ /[0-9]s$/) n *= 1000000; printf "%.0f", n }'
}
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# One connection's tail is at the mercy of the scheduler: the two gateways take turns, ROUNDS
# times each, and each column is the median of the rounds (all rounds listed beside it).
ROUNDS=3
declare -A S_RPS S_P50 S_P99 S_CPU
for r in $(seq "$ROUNDS"); do
  for g in gw-nocont gw upstream; do
    echo "== splice path, round $r: $g, one connection, ${TOKENS}-token stream" >&2
    target="http://127.0.0.1:$UP_SSE" pid=-
    [ "$g" != upstream ] && target="$(url "$g")" pid=$(cat "$WORK/$g.pid")
    read -r rps p50 p99 _ bad cpu _ <<<"$(wrkrun 1 "$WORK/stream.lua" "$target" "$pid")"
    S_RPS[$g]+="$rps " S_P50[$g]+="$(us "$p50") " S_P99[$g]+="$(us "$p99") " S_CPU[$g]+="$cpu "
    ERRORS=$((ERRORS + bad))
  done
done
splice_row() { # splice_row KEY LABEL
  local k="$1"
  printf '| %s | %s | %s µs | %s µs | %s | %s / %s |\n' "$2" "$(median <<<"${S_RPS[$k]}")" \
    "$(median <<<"${S_P50[$k]}")" "$(median <<<"${S_P99[$k]}")" \
    "$([ "$k" = upstream ] || median <<<"${S_CPU[$k]}")" "${S_P50[$k]% }" "${S_P99[$k]% }"
}
added() { # added p50|p99
  local -n col="S_${1^^}"
  awk -v a="$(median <<<"${col[gw]}")" -v b="$(median <<<"${col[gw-nocont]}")" 'BEGIN { printf "%+d µs", a - b }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
verdict() { awk -v v="$1" -v t="$2" -v dir="$3" 'BEGIN { ok = (dir == "max") ? (v <= t) : (v >= t); print ok ? "met" : "missed" }'; }
r16=$(ratio "${RPS[gateway16]}" "${RPS[hop16]}")
r64=$(ratio "${RPS[gateway64]}" "${RPS[hop64]}")
cpu_worst=$(awk -v a="${CPU[gateway16]}" -v b="${CPU[gateway64]}" 'BEGIN { print (a > b) ? a : b }')

LOAD_AFTER=$(cut -d' ' -f1 /proc/loadavg)
COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- gateway scripts || echo ' (with uncommitted changes)')"
SECTION="$WORK/section.md"
cat >"$SECTION" <<MD
# Gateway beside nginx (lean hot path)

Benchmark, not a test: one run of \`scripts/gateway-bench-nginx.sh $DUR\` on $(date -u +%Y-%m-%d) at
commit $COMMIT, $(nproc) cores ($(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)), Linux
$(uname -r), $(nginx -v 2>&1 | sed 's/^nginx version: //'), wrk $(wrk -v 2>&1 | awk 'NR==1 {print $2}'); release build
of \`flotilla-gateway\`; ${DUR} s per measurement, all on loopback. **wrk, the proxy and the
upstream share the $(nproc) cores**, so each row is what that proxy achieves while competing with
them, as it would on a small node. Load average (1 min) when the measurements began and ended:
$LOAD_BEFORE and $LOAD_AFTER (wrk, the proxies and the upstream account for several; with other
work on the machine a single run's figures move by a tenth or more between runs: compare two
binaries with a same-run A/B, as below).

**Setup.** The upstream is nginx (2 workers) answering every \`POST /v1/chat/completions\` with a
fixed chat completion (${#ANSWER} bytes, \`return 200\`; \`/v1/models\` lists the model, which the
gateway checks when a cluster enters its table), and on a second port with a fixed
${TOKENS}-token SSE stream ending in \`[DONE]\`. The nginx hop is a second nginx (2 workers,
\`proxy_pass\` with a keepalive pool, no access log, keepalive up to a million requests per
connection on every side):

\`\`\`nginx
$(sed -e "s/:$UP;/:UPSTREAM_PORT;/" -e "s/:$HOP;/:HOP_PORT;/" <<<"$HOP_CONF")
\`\`\`

The gateway runs with its defaults (prefix routing, one event loop per CPU, continuation on, per-model
health, probes) plus \`$GW_FLAGS\`, model \`m\` routed to the upstream. Load:
\`wrk -t2 -cC -d${DUR}s --latency -s plain.lua URL/v1/chat/completions\`, \`plain.lua\` posting
\`$BODY\`. CPU is the change in utime+stime (\`/proc/PID/stat\`; nginx: master and workers)
over the run, divided by the requests wrk completed; "CPU" is the share of one core.

## Throughput

| conns | path | req/s | p50 | p99 | requests | errors | proxy CPU | proxy CPU ms per 1,000 req |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
${ROWS}
Gateway / nginx hop throughput: **${r16}×** at 16 connections, **${r64}×** at 64.

## The splice path: an uninterrupted stream, continuation on vs off

One connection, closed loop (\`wrk -t1 -c1 -d${DUR}s --latency -s stream.lua\`), a ${TOKENS}-token
stream from the nginx upstream's second port (model \`s\`), $ROUNDS rounds taking turns (a
second gateway, started with \`--continuation false\`, beside the default one); each column is
the median of the rounds. With continuation on (the default) the gateway keeps each relayed
chunk's text and the first chunk so that a broken stream could be finished elsewhere; with
\`--continuation false\` it keeps nothing.

| path | req/s | p50 | p99 | gateway CPU ms per 1,000 streams | p50 / p99 of each round (µs) |
| --- | --- | --- | --- | --- | --- |
$(splice_row upstream "client → nginx upstream")
$(splice_row gw-nocont "client → gateway, \`--continuation false\`")
$(splice_row gw "client → gateway, continuation on")
| **added by continuation** | | **$(added p50)** | **$(added p99)** | | |

## Targets

| target | measured | |
| --- | --- | --- |
| gateway ≥ 0.7 × the nginx hop's throughput at 16 connections | ${r16}× | $(verdict "$r16" 0.7 min) |
| gateway CPU ≤ 25 ms per 1,000 requests (worst of 16 and 64 connections) | $cpu_worst ms | $(verdict "$cpu_worst" 25 max) |

Errors (non-2xx answers and socket errors) over the whole run: $ERRORS.

## Where the gateway's time goes (2026-12-07)

**Event loops.** Until commit c32e3db the gateway ran on one multi-threaded Tokio runtime: a
request's connection task, the pooled upstream connection's task and the two workers woke each
other across threads. It now runs one single-threaded runtime per CPU (\`--worker-threads\`), each
accepting its own connections with its own upstream pool, so a request stays on one thread.
Same-run A/B on this machine, the nginx upstream above, \`wrk -t2 -c16\`, 8 s each, two rounds:
the multi-threaded runtime 29.1k and 32.1k req/s at 38.8 and 34.7 ms CPU per 1,000 requests;
two event loops 46.0k and 39.4k req/s at 27.2 and 25.0 ms; one event loop 38.4k and 39.2k req/s
at 25.7 and 25.2 ms.

**The way in.** A flat profile hid how much a request spent getting from hyper to \`http::infer\`:
two \`axum::middleware::from_fn\` layers (the request id and the \`--max-headers\` check), each
cloning the boxed route it wraps and boxing a \`Next\` and a future per request, then the router's
match, its boxed route and handler, the id formatted with \`write!\` and header names parsed from
strings. Now one hand-written layer (\`edge::Edge\`) does both checks without boxing or cloning
the route; the server runs \`edge::Front\`, which sends a \`POST\` to one of the three inference
paths through that same edge straight to \`http::infer\` (everything else goes through
\`http::app\`'s router, which keeps the edge on every route); and each cluster carries its
request targets and \`Host\` value parsed once (\`upstream::Target\`) with static header names.
Same-run A/B, old binary against new, \`wrk -t2 -c16\`, 5 s per run, rounds alternating, on this
machine while another user's builds and tests ran (load average 3–12), means of the rounds:

| change | CPU ms per 1,000 requests | of which user | rounds lower |
| --- | --- | --- | --- |
| one edge layer for the two middlewares | 29.6 → 25.7 | 17.2 → 15.5 | 6 of 6 |
| targets and \`Host\` parsed once, static header names | 30.5 → 28.6 | 17.2 → 17.0 | 4 of 6 |
| \`Front\`: inference \`POST\`s skip the router | 29.7 → 27.5 | 17.9 → 15.8 | 4 of 6 |
| all three (16 connections, 5 rounds) | 33.7 → 30.4 | 19.4 → 16.5 | 4 of 5 |
| all three (64 connections, 4 rounds) | 34.6 → 29.0 | 21.1 → 16.5 | 4 of 4 |
| all three (16 connections, 4 rounds of 8 s, machine otherwise idle) | 31.9 → 28.9 | 19.7 → 16.0 | 4 of 4 |

Throughput did not clearly follow: 27.4k → 32.0k req/s at 16 connections and 34.8k → 39.0k at
64 in the loaded rounds, 40.0k → 39.7k in the idle ones. The host ran slower during the run
above than during the one at commit c32e3db (the nginx hop 14.2 ms per 1,000 requests against
11.8; the gateway from before these changes 31.9 ms in the idle A/B against 26.0 then), so the
table's 31.2 ms is the A/B's 28.9 ms on a slower host, not a regression. Tried and not kept:
taking a body that has already arrived without setting its timer (\`now_or_never\` before
\`timeout\`) gained nothing (27.0 against 25.7 ms): the body reaches hyper's channel only after
the handler's first poll, so the probe was wasted.

\`perf record -g\` on the gateway during a 16-connection run: about half of its samples in the
kernel, a third of that scheduling (\`finish_task_switch\`, wake-ups under
\`_raw_spin_unlock_irqrestore\` after \`writev\` wakes wrk or nginx, which share the two cores;
on loopback a \`writev\` also runs the receiver's side of TCP). The system calls are already
few: per request 2 \`writev\`, 2 \`recvfrom\` and 0.3 \`epoll_wait\` (\`strace -c\`), the nginx
hop's count; but 0.7 context switches per request against the hop's 0.4 (\`perf stat\`). User
space is flat: hyper's server and client state machines, hyper's parser reserving room for four
times \`--max-headers\` (two 12.8 kB buffers per request at the default 100, about 2 % with
their allocation, so that an over-limit head gets the OpenAI-shaped 431; twice since commit
8568de3, below), the JSON body
parsed into a \`Value\` and validated (2.5 %), hyper-util's pooled client (checkout, a clone of
the client, the dispatch channel; about 2 %), clock reads (1.7 %, some of them hyper's), metrics
keyed by \`String\` labels under SipHash (about 1 %).

**Tried and not kept: driving the upstream connection in the request's task.** hyper-util's
pooled client runs each upstream connection as a task of its own: a request checks a connection
out, clones the client, hands the request through a dispatch channel to that task and is woken
with the answer, and an HTTP/1 answer spawns one more task that puts the connection back once
idle. The experiment replaced it, for plain-HTTP clusters, with a pool per event loop of hyper's
low-level HTTP/1 connections (\`client::conn::http1\`) that the attempt drove itself: it polled
the connection, then the answer without a waker of its own (handing the answer over woke
nothing), read the body the same way and put the connection back; a stream's connection got a
task until the stream ended. It kept hyper-util's rules (most recent connection first, 30 s
idle timeout, a request that never left a connection closed while idle sent again on another,
an answer not read in full closing its connection; a unit test for each) and passed every test.
The profile showed the connection tasks gone, and the system calls and context switches per
request unchanged. Same-run A/B, old binary against new, \`wrk -t2\`, 4–5 s per run, rounds
alternating, while another user's builds ran (load average 2–7): at 16 connections, three runs
(8, 8, 10 rounds), throughput higher in 18 of 26 rounds (means 29.1k → 32.1k, 35.7k → 36.9k,
36.9k → 38.3k req/s) and user CPU lower in 18 of 26, but CPU per 1,000 requests unchanged within
the noise (29.4 → 30.3, 24.6 → 23.8, 24.5 → 24.7 ms); at 64 connections, two runs (6 and 8
rounds), CPU per 1,000 requests higher in 12 of 14 rounds (28.0 → 31.5 and 28.2 → 30.1 ms) and
throughput lower (34.8k → 28.1k, 34.0k → 31.8k req/s), mostly in system time (+2.2 and +2.4 ms;
user +1.3 and −0.5 ms). Not kept: nothing got cheaper per request, and at 64 connections it got dearer. The
wake-ups it removed were within one thread (one event loop per CPU already keeps a request and
its upstream connection on one thread), so they cost little.

**Counted, not timed: user-space instructions per request.** On this shared host an A/B by
time does not resolve a change worth a few per cent (two builds alternating, 5 s rounds, the
same binary's CPU per 1,000 requests ranged 24–41 ms within ten minutes). callgrind's count of
the instructions the gateway executes per proxied request does not move with the load
(\`scripts/gateway-instructions.sh [-n 3000] [BINARY...]\`: one event loop, one keep-alive
connection, an nginx upstream, 200 requests of warm-up uncounted; kernel time is not in it).
Current figure: **74,163 instructions per request** (commit 6823660; 81,759 at b18a7b2, before
\`validate::check\` became one pass over the body's fields, hyper's header room twice
\`--max-headers\` instead of four times, the upstream request was built in place and the request
and attempt counters became handles kept on the model and route).

What the 74k are made of, by the same profile: hyper's server and client (parsing both heads,
the header room, encoding; about 30 %), the request body parsed into a \`serde_json::Value\`
(6 %) and the engine's answer checked to be a JSON object (\`IgnoredAny\`, 5 %), moves of
hyper-util's request futures (\`memcpy\`, 5 %), its pool keys hashed with SipHash twice
(3 %), allocation (8 %).

Left to try: one timer for an attempt's deadline instead of one per step, fewer clock reads per
attempt, and one event loop's connections balanced against the other's (the kernel hands a new
connection to whichever loop accepts first: in some runs one loop served all 16 connections,
in others 8 and 8, which may be part of the run-to-run spread).
MD
write_section "$OUT" gateway-nginx-bench "$SECTION" gateway-bench
echo "wrote the gateway-nginx section of $OUT" >&2
cat "$SECTION"
