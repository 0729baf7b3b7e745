# Helpers shared by the gateway benchmark scripts (sourced, not run): installing missing tools,
# background processes that announce "listening on URL" and are stopped on exit, CPU time of a
# process tree from /proc, and rewriting one marked section of docs/benchmarks.md.
# The sourcing script sets BENCH_NAME (for messages) and may read WORK, PIDS and TCK.

WORK="$(mktemp -d)"
PIDS=()
STARTS=0
TCK=$(getconf CLK_TCK)
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

need() { # need TOOL HOW-TO-INSTALL INSTALL-COMMAND...
  local tool="$1" how="$2"
  shift 2
  command -v "$tool" >/dev/null && return
  if [ "${GATEWAY_BENCH_NO_INSTALL:-0}" = 1 ]; then
    echo "$BENCH_NAME: \`$tool\` is not installed; install it with: $how" >&2
    exit 1
  fi
  echo "$BENCH_NAME: \`$tool\` is not installed; installing it with: $how" >&2
  "$@" >&2
  command -v "$tool" >/dev/null || { echo "$BENCH_NAME: installing $tool failed; run: $how" >&2; exit 1; }
}
apt_install() { # apt_install PACKAGE...: for need
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

# start NAME CMD... : run CMD in the background, wait for "listening on URL"; store the URL
# in $WORK/NAME.url and the process id in $WORK/NAME.pid
start() {
  local name="$1" out u
  shift
  STARTS=$((STARTS + 1))
  out="$WORK/$name.$STARTS.out"
  "$@" >"$out" 2>/dev/null &
  PIDS+=($!)
  echo $! >"$WORK/$name.pid"
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
# tree_ticks PID: utime+stime (clock ticks) of PID and its children (nginx's master and workers)
tree_ticks() {
  local p t=0
  for p in "$1" $(pgrep -P "$1" || true); do
    [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t"
}

# write_section OUT NAME FILE [AFTER]: put FILE between NAME's begin and end markers in OUT,
# replacing what was there; a new section goes after AFTER's end marker, else at the end.
write_section() {
  python3 - "$@" <<'PY'
import sys
out, name, section = sys.argv[1], sys.argv[2], open(sys.argv[3]).read().rstrip() + "\n"
after = sys.argv[4] if len(sys.argv) > 4 else None
begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
try:
    text = open(out).read()
except FileNotFoundError:
    text = "# Benchmarks\n"
block = f"{begin}\n{section}{end}\n"
anchor = f"<!-- {after}:end -->\n" if after else None
if begin in text and end in text:
    text = text[: text.index(begin)] + block + text[text.index(end) + len(end) + 1 :]
elif anchor and anchor in text:
    i = text.index(anchor) + len(anchor)
    text = text[:i] + "\n" + block + text[i:]
else:
    text = text.rstrip() + "\n\n" + block
open(out, "w").write(text)
PY
}
