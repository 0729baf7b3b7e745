"""Fixtures for the openai-client tests: engine simulators and the gateway started as real
processes on loopback ports (binaries from FLOTILLA_GATEWAY_BIN / FLOTILLA_ENGINESIM_BIN,
built by scripts/gateway-pytest.sh), torn down at the end of the session."""

import hashlib
import os
import socket
import subprocess
import tempfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
GATEWAY = os.environ.get("FLOTILLA_GATEWAY_BIN", os.path.join(TARGET, "debug", "flotilla-gateway"))
ENGINESIM = os.environ.get("FLOTILLA_ENGINESIM_BIN", os.path.join(TARGET, "debug", "flotilla-enginesim"))
API_KEY = "test-key"
# A key stored as its digest in a keys file: only model `m`, two requests a minute.
LIMITED_KEY = "limited-key"


def _start(argv):
    """Start a process that prints `listening on http://ADDR` first; return (process, url)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"{argv[0]} did not start: {line!r}")
    return proc, line.removeprefix("listening on ")


def _stop(procs):
    """Terminate `procs`, killing any that do not exit within 10 s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def _routing_file(text, prefix):
    """Write a routing table to a fresh temporary directory; its path."""
    path = os.path.join(tempfile.mkdtemp(prefix=prefix), "routing.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def _dead_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def gateway_url():
    procs = []
    try:
        sims = {}
        for name, args in {
            "eu-1": ["--model", "m", "--max-model-len", "64", "--default-tokens", "6"],
            "eu-2": ["--model", "limited", "--fault", "rate-limit:30"],
            "eu-3": ["--model", "flaky", "--fault", "cut:2", "--default-tokens", "8"],
            "eu-4": ["--model", "busy", "--model", "calm", "--model-fault", "busy=rate-limit:30"],
        }.items():
            proc, url = _start([ENGINESIM, "--listen", "127.0.0.1:0", "--name", name, *args])
            procs.append(proc)
            sims[name] = url
        sims["eu-down"] = _dead_url()
        clusters = "".join(
            f"  - {{name: {n}, url: \"{u}\", jurisdiction: EU, region: eu-central-1}}\n" for n, u in sims.items()
        )
        table = (
            "clusters:\n" + clusters + "models:\n"
            "  - {name: m, aliases: [m-alias], routes: [{cluster: eu-1}]}\n"
            "  - {name: limited, routes: [{cluster: eu-2}]}\n"
            "  - {name: flaky, routes: [{cluster: eu-3}]}\n"
            "  - {name: down, routes: [{cluster: eu-down}]}\n"
            "  - {name: busy, routes: [{cluster: eu-4}]}\n"
            "  - {name: calm, routes: [{cluster: eu-4}]}\n"
        )
        path = _routing_file(table, "flotilla-gw-")
        keys = os.path.join(os.path.dirname(path), "keys.yaml")
        digest = hashlib.sha256(LIMITED_KEY.encode()).hexdigest()
        with open(keys, "w") as f:
            f.write(f"keys:\n  - {{id: limited, sha256: {digest}, models: [m], requestsPerMinute: 2}}\n")
        proc, url = _start([
            GATEWAY, "--listen", "127.0.0.1:0", "--config", path, "--api-keys", API_KEY, "--keys-file", keys,
            "--connect-timeout-ms", "300", "--backoff-base-ms", "20",
        ])
        procs.append(proc)
        yield url
    finally:
        _stop(procs)


@pytest.fixture()
def client(gateway_url):
    import openai

    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)


# Continuation: each test has its own model, served by engine `a` (whose streams of it break)
# and engine `b`; every model has its own pair of clusters, named `<model>-a` / `<model>-b` so
# that the idle `-a` cluster is chosen first (least load, then name) and the `-b` one continues.
CONTINUATION_MODELS = {
    # model: (flags for engine a, flags for engine b, extra fields for the b route; routes that
    # declare nothing regenerate)
    "cut": (["--stream-fault", "cut=cut:3*"], [], ", continuation: prefill"),
    "stall": (["--stream-fault", "stall=stall:3:60000*"], [], ", continuation: prefill"),
    "malformed": (["--stream-fault", "malformed=malformed:3*"], [], ""),
    "refuse": (["--stream-fault", "refuse=cut:3*"], ["--refuse-prefill", "refuse"], ", continuation: prefill"),
    "nondet": (["--stream-fault", "nondet=cut:3*"], ["--nondeterministic", "nondet"], ", continuation: regenerate"),
    "euonly": (["--stream-fault", "euonly=cut:2*"], ["--stream-fault", "euonly=cut:2*"], ""),
}


@pytest.fixture(scope="session")
def continuation_sims():
    """Engines `a`, `b` (EU) and `us` (US), every continuation model on each; their URLs, and
    the gateway in front of them (least-load routing, a short idle timeout)."""
    procs = []
    try:
        urls = {}
        for side in ("a", "b", "us"):
            argv = [ENGINESIM, "--listen", "127.0.0.1:0", "--name", side, "--default-tokens", "10"]
            for model, (a_flags, b_flags, _) in CONTINUATION_MODELS.items():
                argv += ["--model", model] + {"a": a_flags, "b": b_flags, "us": []}[side]
            proc, urls[side] = _start(argv)
            procs.append(proc)
        clusters, models = "", ""
        for model, (_, _, b_extra) in CONTINUATION_MODELS.items():
            names = {side: f"{model}-{side}" for side in ("a", "b", "us")}
            for side, name in names.items():
                j = "US" if side == "us" else "EU"
                clusters += f"  - {{name: {name}, url: \"{urls[side]}\", jurisdiction: {j}, region: {j.lower()}-1}}\n"
            routes = [f"{{cluster: {names['a']}}}", f"{{cluster: {names['b']}{b_extra}}}"]
            policy = ""
            if model == "euonly":  # a US route in the table, never allowed for this model
                routes.append(f"{{cluster: {names['us']}}}")
                policy = ", sovereignty: {allowedJurisdictions: [EU]}"
            models += f"  - {{name: {model}{policy}, routes: [{', '.join(routes)}]}}\n"
        path = _routing_file("clusters:\n" + clusters + "models:\n" + models, "flotilla-gw-cont-")
        proc, url = _start([
            GATEWAY, "--listen", "127.0.0.1:0", "--config", path, "--routing", "least-load",
            "--idle-timeout-ms", "500", "--connect-timeout-ms", "300", "--backoff-base-ms", "20",
            "--scrape-interval-ms", "0", "--allow-anonymous",
        ])
        procs.append(proc)
        yield {"gateway": url, **urls}
    finally:
        _stop(procs)
