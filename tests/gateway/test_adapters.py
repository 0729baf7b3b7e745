"""LoRA adapters through the official openai client: model `chat` is served by an EU engine and a
US engine, and its adapter `support-eu` (EU only) is loaded on both engines — the US one could
answer it. `client.models.list()` shows the adapter with its base as `parent`; requests for it,
plain and streamed, are answered from the EU; with the EU engine stopped they fail with an
APIStatusError instead of reaching the US engine, whose log holds no request for the adapter, while
`chat` itself fails over to the US."""

import json
import urllib.request

import openai
import pytest

from conftest import API_KEY, ENGINESIM, GATEWAY, _routing_file, _start, _stop


def engine_log(url, model):
    """Inference requests for `model` the engine at `url` has received."""
    with urllib.request.urlopen(url + "/sim/stats", timeout=5) as r:
        return sum(1 for e in json.load(r)["log"] if e["model"] == model)


@pytest.fixture()
def fleet():
    procs = []
    try:
        sims = {}
        for name in ["eu", "us"]:
            proc, url = _start([ENGINESIM, "--listen", "127.0.0.1:0", "--name", name, "--model", "chat",
                                "--lora", "support-eu=chat", "--ttft-ms", "1", "--itl-ms", "0",
                                "--default-tokens", "2"])
            procs.append(proc)
            sims[name] = (proc, url)
        table = (
            "clusters:\n"
            f"  - {{name: eu, url: \"{sims['eu'][1]}\", jurisdiction: EU}}\n"
            f"  - {{name: us, url: \"{sims['us'][1]}\", jurisdiction: US}}\n"
            "models:\n"
            "  - {name: chat, routes: [{cluster: eu}, {cluster: us}]}\n"
            "  - {name: support-eu, parent: chat, sovereignty: {allowedJurisdictions: [EU]},"
            " routes: [{cluster: eu}, {cluster: us}]}\n"
        )
        path = _routing_file(table, "flotilla-gw-adapters-")
        gw, url = _start([GATEWAY, "--listen", "127.0.0.1:0", "--config", path, "--api-keys", API_KEY,
                          "--scrape-interval-ms", "0", "--probe-interval-ms", "0"])
        procs.append(gw)
        yield url, sims
    finally:
        _stop(procs)


def test_an_eu_only_adapter_is_listed_with_its_parent_and_never_answered_from_the_us(fleet):
    url, sims = fleet
    c = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)
    models = {m.id: m for m in c.models.list()}
    assert (models["support-eu"].model_extra or {}).get("parent") == "chat", models["support-eu"]
    assert "parent" not in (models["chat"].model_extra or {})

    for stream in [False, True]:
        raw = c.chat.completions.with_raw_response.create(
            model="support-eu", messages=[{"role": "user", "content": "bonjour"}], max_tokens=2, stream=stream)
        if stream:
            assert list(raw.parse())
        else:
            assert raw.parse().model == "support-eu"
        assert raw.headers["x-flotilla-cluster"] == "eu"

    sims["eu"][0].kill()
    sims["eu"][0].wait()
    for _ in range(3):
        with pytest.raises(openai.APIStatusError) as refused:
            c.chat.completions.create(model="support-eu", messages=[{"role": "user", "content": "bonjour"}],
                                      max_tokens=2)
        assert refused.value.status_code in (502, 503), refused.value
    answer = c.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=2)
    assert answer.headers["x-flotilla-cluster"] == "us"
    assert engine_log(sims["us"][1], "support-eu") == 0
