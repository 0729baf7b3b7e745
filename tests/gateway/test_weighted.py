"""Weighted traffic through the official openai client: a routing file splits model `chat`
between deployments `stable` (weight 90, on cluster `a`) and `canary` (weight 10, on cluster
`b`). Requests with distinct prompts land 90/10 (within 5 points over 400), counted from the
`x-flotilla-cluster` header and at the engines; one prompt always lands on the same
deployment, streamed or not; with the canary's weight at 0 it receives nothing."""

import json
import urllib.request

import openai
import pytest

from conftest import API_KEY, ENGINESIM, GATEWAY, _routing_file, _start, _stop


def table(sims, canary_weight):
    return (
        "clusters:\n"
        f"  - {{name: a, url: \"{sims['a']}\", jurisdiction: EU}}\n"
        f"  - {{name: b, url: \"{sims['b']}\", jurisdiction: EU}}\n"
        "models:\n"
        "  - name: chat\n"
        f"    deployments: [{{name: stable, weight: 90}}, {{name: canary, weight: {canary_weight}}}]\n"
        "    routes: [{cluster: a, deployment: stable}, {cluster: b, deployment: canary}]\n"
    )


def engine_requests(url):
    """Inference requests for `chat` the engine at `url` has received."""
    with urllib.request.urlopen(url + "/sim/stats", timeout=5) as r:
        return sum(1 for e in json.load(r)["log"] if e["model"] == "chat")


def gateway(sims, canary_weight):
    path = _routing_file(table(sims, canary_weight), "flotilla-gw-weighted-")
    return _start([GATEWAY, "--listen", "127.0.0.1:0", "--config", path, "--api-keys", API_KEY,
                   "--scrape-interval-ms", "0", "--probe-interval-ms", "0"])


@pytest.fixture(scope="module")
def sims():
    procs = []
    try:
        urls = {}
        for name in ["a", "b"]:
            proc, url = _start([ENGINESIM, "--listen", "127.0.0.1:0", "--name", name, "--model", "chat",
                                "--ttft-ms", "1", "--itl-ms", "0", "--default-tokens", "2"])
            procs.append(proc)
            urls[name] = url
        yield urls
    finally:
        _stop(procs)


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)


def ask(c, prompt, stream=False):
    raw = c.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": prompt}], max_tokens=2, stream=stream)
    if stream:
        list(raw.parse())
    else:
        assert raw.parse().choices[0].message.content
    return raw.headers["x-flotilla-cluster"]


def test_the_split_follows_the_weights_and_sticks_per_prompt(sims):
    proc, url = gateway(sims, 10)
    try:
        c = client(url)
        before = {n: engine_requests(u) for n, u in sims.items()}
        served = [ask(c, f"conversation {i}: what changed in the release?") for i in range(400)]
        after = {n: engine_requests(u) for n, u in sims.items()}
        counted = {n: after[n] - before[n] for n in sims}
        assert counted == {"a": served.count("a"), "b": served.count("b")}, counted
        assert abs(counted["b"] / 400 - 0.10) <= 0.05, counted
        homes = {ask(c, "the same conversation", stream=i % 2 == 1) for i in range(10)}
        assert len(homes) == 1, homes
    finally:
        _stop([proc])


def test_weight_zero_takes_nothing(sims):
    proc, url = gateway(sims, 0)
    try:
        c = client(url)
        before = engine_requests(sims["b"])
        served = {ask(c, f"conversation {i}") for i in range(50)}
        assert served == {"a"}
        assert engine_requests(sims["b"]) == before
    finally:
        _stop([proc])
