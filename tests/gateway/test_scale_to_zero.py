"""Scale to zero seen through the official openai client: model `z` is marked `scaleToZero`
and has no Ready route. A request is held by the gateway (not refused) until its route appears
in the table — here the table file gains it 1.5 s later, as the control cluster's table does
when the first replica is Ready — and then answered; the gateway's metrics show it was held
and the cold start. A gateway whose activation wait is short answers 503 with Retry-After in
the OpenAI error shape."""

import os
import threading
import time
import urllib.request

import openai
import pytest
from conftest import ENGINESIM, GATEWAY, _routing_file, _start, _stop

DELAY_S = 1.5


def _table(sim, routes):
    return (
        "clusters:\n"
        f"  - {{name: eu-1, url: \"{sim}\", jurisdiction: EU, region: eu-central-1}}\n"
        "models:\n"
        f"  - {{name: z, scaleToZero: true, routes: [{routes}]}}\n"
    )


def _metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.fixture(scope="module")
def zero_fleet():
    procs = []
    try:
        proc, sim = _start([ENGINESIM, "--listen", "127.0.0.1:0", "--name", "eu-1", "--model", "z"])
        procs.append(proc)
        path = _routing_file(_table(sim, ""), "flotilla-gw-zero-")
        common = ["--listen", "127.0.0.1:0", "--config", path, "--allow-anonymous", "--scrape-interval-ms", "0",
                  "--reload-interval-ms", "100", "--activation-retry-after-s", "9"]
        proc, patient = _start([GATEWAY, *common, "--activation-timeout-ms", "20000"])
        procs.append(proc)
        proc, hasty = _start([GATEWAY, *common, "--activation-timeout-ms", "500"])
        procs.append(proc)
        yield {"sim": sim, "path": path, "patient": patient, "hasty": hasty}
    finally:
        _stop(procs)


def test_a_request_at_zero_waits_for_the_first_replica_then_succeeds(zero_fleet):
    client = openai.OpenAI(base_url=zero_fleet["patient"] + "/v1", api_key="unused", max_retries=0, timeout=30)
    assert [m.id for m in client.models.list()] == ["z"], "listed at zero replicas"

    def ready_later():
        time.sleep(DELAY_S)
        tmp = zero_fleet["path"] + ".tmp"
        with open(tmp, "w") as f:
            f.write(_table(zero_fleet["sim"], "{cluster: eu-1}"))
        os.replace(tmp, zero_fleet["path"])

    threading.Thread(target=ready_later, daemon=True).start()
    started = time.monotonic()
    answer = client.chat.completions.create(model="z", messages=[{"role": "user", "content": "wake up"}], max_tokens=3)
    waited = time.monotonic() - started
    assert answer.choices[0].message.content
    assert waited >= DELAY_S, f"answered after {waited:.2f} s: it was not held"
    url = zero_fleet["patient"]
    assert _metric(url, 'flotilla_gateway_held_requests_ended_total{result="served"}') == 1
    assert _metric(url, "flotilla_gateway_cold_start_seconds_count") == 1
    assert _metric(url, "flotilla_gateway_cold_start_seconds_sum") >= DELAY_S - 0.2


def test_an_expired_wait_is_a_503_with_retry_after(zero_fleet):
    # The hasty gateway reads the same table; run after the route was added, so take it away.
    with open(zero_fleet["path"], "w") as f:
        f.write(_table(zero_fleet["sim"], ""))
    time.sleep(0.5)
    client = openai.OpenAI(base_url=zero_fleet["hasty"] + "/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="z", messages=[{"role": "user", "content": "wake up"}], max_tokens=3)
    assert e.value.status_code == 503
    assert e.value.response.headers["retry-after"] == "9"
    err = e.value.body if isinstance(e.value.body, dict) else {}
    assert err.get("code") == "model_activating", e.value.body
    assert _metric(zero_fleet["hasty"], 'flotilla_gateway_held_requests_ended_total{result="expired"}') == 1
