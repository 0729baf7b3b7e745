"""The gateway in front of a real engine, beside a direct request in the same run (driven by
scripts/gateway-bench-llama.sh, which builds what it needs): one llama.cpp `llama-server`
(tests/gateway/llama_fleet.py) serving the tiny test model, and a release `flotilla-gateway`
routing model `tiny` to it. One connection each way, closed loop; blocks of requests take turns
(direct, gateway, direct, gateway, ...) so drift of the machine falls on both paths alike. Per
path and kind (plain, streamed): latency percentiles; the gateway's added latency is the
difference of the medians. The gateway's CPU per request is its utime+stime (/proc) over its
blocks, less what it spent idle over the direct blocks of the same length (/proc counts clock
ticks, 10 ms here: 1,200 requests per path keep that within about ±0.1 ms per request). Prints
a Markdown section on stdout."""

import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gateway"))

from conftest import GATEWAY, _routing_file, _start, _stop  # noqa: E402
from llama_fleet import _model, start_engine  # noqa: E402

BLOCKS = int(os.environ.get("BENCH_BLOCKS", "6"))
PER_BLOCK = int(os.environ.get("BENCH_PER_BLOCK", "200"))
MAX_TOKENS = int(os.environ.get("BENCH_MAX_TOKENS", "8"))
TCK = os.sysconf("SC_CLK_TCK")


def body(stream):
    return json.dumps({
        "model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 7, "stream": stream,
        "messages": [{"role": "user", "content": "Name the clusters of the fleet."}],
    })


class Client:
    """One keep-alive connection to `url`."""

    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)

    def ask(self, stream):
        """Seconds for one whole answer (the last byte of the stream). A keep-alive connection
        the server closed while idle is opened again, outside the measured time."""
        for attempt in (1, 2):
            start = time.perf_counter()
            try:
                self.conn.request("POST", "/v1/chat/completions", body(stream), {"content-type": "application/json"})
                r = self.conn.getresponse()
                data = r.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                if attempt == 2:
                    raise
        took = time.perf_counter() - start
        if r.status != 200 or (stream and b"[DONE]" not in data):
            raise RuntimeError(f"answer {r.status}: {data[:300]!r}")
        return took


def ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    procs = []
    logs = tempfile.mkdtemp(prefix="flotilla-bench-llama-")
    try:
        engine, engine_url = start_engine(_model(), logs, "llama")
        procs.append(engine)
        table = (
            "clusters:\n"
            f"  - {{name: llama, url: \"{engine_url}\", jurisdiction: EU, region: eu-central-1}}\n"
            "models:\n  - {name: tiny, routes: [{cluster: llama}]}\n"
        )
        gw, gw_url = _start([GATEWAY, "--listen", "127.0.0.1:0", "--config", _routing_file(table, "flotilla-bench-"),
                             "--allow-anonymous"])
        procs.append(gw)
        paths = {"direct": Client(engine_url), "gateway": Client(gw_url)}
        for c in paths.values():  # warm: connections, the engine's caches
            for stream in (False, True):
                for _ in range(5):
                    c.ask(stream)
        lat = {(p, s): [] for p in paths for s in (False, True)}
        busy = {"direct": [0, 0.0], "gateway": [0, 0.0]}  # gateway ticks, seconds, per path's blocks
        for b in range(BLOCKS * 2):
            path = "direct" if b % 2 == 0 else "gateway"
            t0, w0 = ticks(gw.pid), time.perf_counter()
            for i in range(PER_BLOCK):
                stream = i % 2 == 1
                lat[(path, stream)].append(paths[path].ask(stream))
            busy[path][0] += ticks(gw.pid) - t0
            busy[path][1] += time.perf_counter() - w0
        requests = BLOCKS * PER_BLOCK
        idle_rate = busy["direct"][0] / busy["direct"][1]  # ticks per second while idle
        cpu_ms = 1000 * (busy["gateway"][0] - idle_rate * busy["gateway"][1]) / TCK / requests
    finally:
        _stop(procs)

    version = os.path.basename(os.path.dirname(os.path.dirname(os.environ.get("FLOTILLA_LLAMA_SERVER_BIN", ""))))
    out = [
        "## In front of a real engine (`scripts/gateway-bench-llama.sh`)",
        "",
        f"One `llama-server` ({version}, CPU, `-t 1 -np 1`) serving the tiny test model",
        f"(`scripts/make-test-gguf.py`), answers of {MAX_TOKENS} tokens at temperature 0; one keep-alive",
        f"connection each way, closed loop, {BLOCKS} blocks of {PER_BLOCK} requests per path taking turns",
        "(half plain, half streamed), the release gateway with its defaults and `--allow-anonymous`.",
        "Latency is to the answer's last byte. Gateway CPU is its utime+stime over its blocks, less",
        "its idle rate over the direct blocks, per request.",
        "",
        "| kind | direct p50 | direct p99 | through the gateway p50 | p99 | **added p50** |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for stream, kind in ((False, "plain"), (True, "streamed")):
        d, g = lat[("direct", stream)], lat[("gateway", stream)]
        dm, gm = statistics.median(d), statistics.median(g)
        out.append(
            f"| {kind} | {dm * 1e3:.2f} ms | {pct(d, 0.99) * 1e3:.2f} ms | {gm * 1e3:.2f} ms | "
            f"{pct(g, 0.99) * 1e3:.2f} ms | **{(gm - dm) * 1e3:+.2f} ms** |"
        )
    out += ["", f"Gateway CPU per request: **{cpu_ms:.2f} ms** ({requests} requests through it)."]
    print("\n".join(out))


if __name__ == "__main__":
    main()
