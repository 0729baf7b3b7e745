"""Member configuration through the official openai client: a cluster URL written as LiteLLM's
`api_base` is (with `/v1`) whose engine demands an API key (`--api-key`, the gateway sends the
cluster's token), and misconfigured clusters (a wrong path, a missing token) answered with an
honest 502 `upstream_misconfigured` that the SDK raises as an InternalServerError without
retrying it as an outage."""

import os

import openai
import pytest

from conftest import API_KEY, ENGINESIM, GATEWAY, _routing_file, _start, _stop

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def gateway_url():
    procs = []
    try:
        proc, secured = _start([ENGINESIM, "--listen", "127.0.0.1:0", "--name", "secured", "--model", "m",
                                "--api-key", "engine-secret"])
        procs.append(proc)
        proc, plain = _start([ENGINESIM, "--listen", "127.0.0.1:0", "--name", "plain", "--model", "wrongpath"])
        procs.append(proc)
        path = _routing_file("placeholder", "flotilla-gw-member-")
        token = os.path.join(os.path.dirname(path), "token")
        with open(token, "w") as f:
            f.write("engine-secret\n")
        table = (
            "clusters:\n"
            f"  - {{name: secured, url: \"{secured}/v1\", jurisdiction: EU, tokenFile: \"{token}\"}}\n"
            f"  - {{name: notoken, url: \"{secured}\", jurisdiction: EU}}\n"
            f"  - {{name: wrong, url: \"{plain}/api\", jurisdiction: EU}}\n"
            "models:\n"
            "  - {name: m, routes: [{cluster: secured}]}\n"
            "  - {name: m-notoken, routes: [{cluster: notoken}]}\n"
            "  - {name: wrongpath, routes: [{cluster: wrong}]}\n"
        )
        with open(path, "w") as f:
            f.write(table)
        proc, url = _start([GATEWAY, "--listen", "127.0.0.1:0", "--config", path, "--api-keys", API_KEY,
                            "--scrape-interval-ms", "0", "--probe-interval-ms", "0"])
        procs.append(proc)
        yield url
    finally:
        _stop(procs)


@pytest.fixture()
def client(gateway_url):
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)


def test_a_v1_url_and_the_clusters_token_serve(client):
    raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert raw.headers["x-flotilla-cluster"] == "secured"
    assert raw.parse().choices[0].message.content


@pytest.mark.parametrize("model,reason", [("wrongpath", "UpstreamNotFound"), ("m-notoken", "UpstreamUnauthorized")])
def test_misconfigured_clusters_get_an_honest_502(client, model, reason):
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model=model, messages=MESSAGES)
    assert e.value.status_code == 502
    assert e.value.code == "upstream_misconfigured"
    assert reason in e.value.message
    assert "retry-after" not in e.value.response.headers
