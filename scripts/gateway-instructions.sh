#!/usr/bin/env bash
# Benchmark (not a test): the gateway's user-space instructions per proxied request, counted by
# callgrind, which unlike a timing does not move with what else the machine runs. An nginx
# upstream answers every `POST /v1/chat/completions` with a fixed chat completion (as in
# scripts/gateway-bench-nginx.sh); the gateway (one event loop) runs under callgrind; a client
# sends requests one after another on one keep-alive connection: a warm-up uninstrumented, then
# N counted. Prints, per binary, the instructions per request and the functions that executed
# the most of them (self cost). Kernel time (system calls, TCP on loopback, scheduling) is not
# counted: compare it with scripts/gateway-bench-nginx.sh's CPU per request.
#
# Usage: scripts/gateway-instructions.sh [-n REQUESTS (default 3000)] [GATEWAY-BINARY...]
# (default: the release build of this tree, built first). Several binaries are measured one
# after another on the same requests: an A/B of two commits' builds.
# Tools: valgrind, nginx, python3; installed when missing unless GATEWAY_BENCH_NO_INSTALL=1.
set -euo pipefail
cd "$(dirname "$0")/.."
N=3000
if [ "${1:-}" = -n ]; then
  N="$2"
  shift 2
fi
BENCH_NAME=gateway-instructions
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
export PATH="$PATH:/usr/sbin"
need python3 "apt-get install -y python3" apt_install python3
need nginx "apt-get install -y nginx-light" apt_install nginx-light
need valgrind "apt-get install -y valgrind" apt_install valgrind
BINS=("$@")
if [ ${#BINS[@]} = 0 ]; then
  cargo build --quiet --release --locked -p flotilla-gateway
  BINS=("${CARGO_TARGET_DIR:-target}/release/flotilla-gateway")
fi
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

UP=$(free_port)
ANSWER='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
mkdir -p "$WORK/up"
cat >"$WORK/up/nginx.conf" <<CONF
daemon off; worker_processes 1; $([ "$(id -u)" = 0 ] && echo 'user root;')
pid $WORK/up/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off; keepalive_requests 1000000; keepalive_timeout 60s;
  server {
    listen 127.0.0.1:$UP;
    location = /v1/chat/completions { default_type application/json; return 200 '$ANSWER'; }
    location = /v1/models { default_type application/json; return 200 '{"object":"list","data":[{"id":"m","object":"model"}]}'; }
    location = /metrics { default_type text/plain; return 200 'vllm:num_requests_waiting 0\n'; }
  }
}
CONF
nginx -p "$WORK/up" -e "$WORK/up/error.log" -c "$WORK/up/nginx.conf" &
PIDS+=($!)
cat >"$WORK/table.yaml" <<YAML
clusters:
  - {name: up, url: "http://127.0.0.1:$UP", jurisdiction: EU, region: eu-central-1}
models:
  - {name: m, routes: [{cluster: up}]}
YAML

# send PORT COUNT: COUNT requests, one after another, each answer read in full
send() {
  python3 - "$1" "$2" <<'PY'
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
body = b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"ping"}]}'
req = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
s = socket.create_connection(("127.0.0.1", port))
for _ in range(n):
    s.sendall(req)
    buf = b""
    while b'"total_tokens":2}}' not in buf:
        got = s.recv(65536)
        if not got:
            sys.exit("the gateway closed the connection: " + buf.decode(errors="replace"))
        buf += got
PY
}

for bin in "${BINS[@]}"; do
  port=$(free_port)
  out="$WORK/callgrind.out"
  rm -f "$out"*
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" "$bin" --listen "127.0.0.1:$port" \
    --config "$WORK/table.yaml" --worker-threads 1 --scrape-interval-ms 600000 --probe-interval-ms 600000 \
    --allow-anonymous >"$WORK/gw.out" 2>"$WORK/gw.err" &
  gw=$!
  PIDS+=("$gw")
  for _ in $(seq 600); do
    grep -q "listening on" "$WORK/gw.out" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "listening on" "$WORK/gw.out" || { echo "$BENCH_NAME: $bin did not start" >&2; cat "$WORK/gw.err" >&2; exit 1; }
  send "$port" 200
  callgrind_control -i on "$gw" >/dev/null
  send "$port" "$N"
  callgrind_control -i off "$gw" >/dev/null
  callgrind_control -d "$gw" >/dev/null
  kill "$gw"
  wait "$gw" 2>/dev/null || true
  dump=$(ls "$out".* | tail -1)
  total=$(callgrind_annotate "$dump" | awk '/PROGRAM TOTALS/ { gsub(/,/, "", $1); print $1 }')
  echo "$bin: $((total / N)) instructions per request (user space, $N requests)"
  # (awk stops at 15 lines itself: a `head` would end the pipe early, which pipefail reports)
  callgrind_annotate "$dump" | awk '/file:function/ { on = 1; getline; next } on && NF && shown++ < 15' |
    sed -E 's/ \[[^]]*\]$//; s/^/  /' | cut -c1-160
done
