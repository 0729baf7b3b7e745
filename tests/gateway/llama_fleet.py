"""Real engines for the gateway's tests: llama.cpp's `llama-server` (built from source by
scripts/build-llama-server.sh, its path in FLOTILLA_LLAMA_SERVER_BIN) serving the tiny test model
of scripts/make-test-gguf.py on free loopback ports, two of them behind a `flotilla-gateway`
([`Fleet`]). A missing binary fails the test that asks for it, saying how to build it: nothing
is skipped."""

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import GATEWAY, ROOT, _routing_file, _start, _stop

LLAMA_SERVER = os.environ.get("FLOTILLA_LLAMA_SERVER_BIN", "")
MESSAGES = [{"role": "user", "content": "Name the clusters of the fleet."}]
# Greedy decoding: the same prompt gets the same answer from either engine.
GREEDY = {"temperature": 0, "seed": 7}


def _binary():
    """llama-server's path, or a failure saying how to get it."""
    if not LLAMA_SERVER or not os.access(LLAMA_SERVER, os.X_OK):
        pytest.fail(
            f"llama-server not found (FLOTILLA_LLAMA_SERVER_BIN={LLAMA_SERVER!r}): build it with "
            "`bash scripts/build-llama-server.sh` and export the path it prints as FLOTILLA_LLAMA_SERVER_BIN "
            "(scripts/gateway-pytest.sh does both)"
        )
    return LLAMA_SERVER


def _model():
    """The test GGUF (written once per version of its script, then cached)."""
    llama_src = os.path.join(os.path.dirname(os.path.dirname(_binary())), "src", "vendor", "llama.cpp")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "make-test-gguf.py"), llama_src],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip()


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def metric(text, name):
    """The value of the sample `name` (with its labels, exactly) in a Prometheus page; 0 if absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def start_engine(model, log_dir, name, port=0):
    """One llama-server on loopback (`port`, or a free one), the model loaded; (process, url)."""
    log = os.path.join(log_dir, f"{name}.log")
    argv = [
        _binary(), "-m", model, "--alias", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "-c", "4096", "-np", "1", "-t", "1", "--metrics", "--no-webui", "--no-warmup",
    ]
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if url is None:
            with open(log) as f:
                for line in f:
                    if "listening on http://" in line:
                        url = line.strip().rsplit("listening on ", 1)[1].rstrip("/")
        if url is not None:
            try:
                if get(url + "/health")[0] == 200:
                    return proc, url
            except (urllib.error.URLError, OSError):
                pass  # listening, model still loading (503) or not yet accepting
        time.sleep(0.1)
    proc.kill()
    with open(log) as f:
        tail = f.read()[-3000:]
    raise RuntimeError(f"llama-server {name} did not become healthy within 60 s; its log ends:\n{tail}")


class Fleet:
    """Two engines `llama-a` and `llama-b` serving model `tiny`, and the gateway in front."""

    def __init__(self, continuation=None, gateway_args=("--scrape-interval-ms", "0")):
        self.procs = []
        self.engines = {}
        self.model = model = _model()
        self.logs = tempfile.mkdtemp(prefix="flotilla-llama-")
        try:
            for name in ("llama-a", "llama-b"):
                proc, url = start_engine(model, self.logs, name)
                self.procs.append(proc)
                self.engines[name] = (proc, url)
            extra = f", continuation: {continuation}" if continuation else ""
            table = (
                "clusters:\n"
                + "".join(
                    f"  - {{name: {n}, url: \"{u}\", jurisdiction: EU, region: eu-central-1}}\n"
                    for n, (_, u) in self.engines.items()
                )
                + "models:\n"
                + f"  - {{name: tiny, routes: [{{cluster: llama-a{extra}}}, {{cluster: llama-b{extra}}}]}}\n"
            )
            proc, self.gateway = _start([
                GATEWAY, "--listen", "127.0.0.1:0", "--config", _routing_file(table, "flotilla-gw-llama-"),
                "--routing", "least-load", "--allow-anonymous",
                "--connect-timeout-ms", "300", "--backoff-base-ms", "20", "--idle-timeout-ms", "2000",
                *gateway_args,
            ])
            self.procs.append(proc)
        except BaseException:
            _stop(self.procs)
            raise

    def url(self, name):
        return self.engines[name][1]

    def restart(self, name):
        """Start engine `name` again on its port (after it was killed); its new process."""
        old, url = self.engines[name]
        port = int(url.rsplit(":", 1)[1])
        proc, url = start_engine(self.model, self.logs, f"{name}-again", port=port)
        self.procs.append(proc)
        self.engines[name] = (proc, url)
        return proc

    def log_tail(self, name, chars=3000):
        """The end of engine `name`'s log, for a failure message."""
        with open(os.path.join(self.logs, f"{name}.log")) as f:
            return f.read()[-chars:]

    def client(self, url=None):
        return openai.OpenAI(base_url=(url or self.gateway) + "/v1", api_key="none", max_retries=0, timeout=60)

    def stop(self):
        _stop(self.procs)


