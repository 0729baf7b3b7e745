"""A primary down for 60 s, then healthy, seen through the official openai client: model `m`
is served by the `primary` engine, with fallback model `m-fb` on the `backup` engine. While
`m` is down on the primary (503, left out of its `/v1/models`), every request, plain or
streamed, is answered by the fallback: no client-visible failure. Once the primary recovers,
the gateway's background probe lets traffic back onto it within the documented 10 s, without a
user request spent finding out: the engines' counters show that the primary refused exactly the
`--breaker-failures` requests that opened its circuit and the probe's one-token requests (the
gateway's `flotilla_gateway_probes_total{kind="request"}`), and no user request after."""

import json
import time
import urllib.request

import pytest
from conftest import ENGINESIM, GATEWAY, _routing_file, _start, _stop

OUTAGE_S = 60
RECOVERY_BOUND_S = 10  # docs/gateway.md: "within 10 s" (at most 7 s with the defaults)
BREAKER_FAILURES = 5  # the gateway's default, passed explicitly because the test counts on it
PACE_S = 0.25
MESSAGES = [{"role": "user", "content": "Where does this answer come from?"}]


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def _post(url, body):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status


def _probe_requests(gateway, cluster):
    """The gateway's one-token probes of `cluster` by result (`flotilla_gateway_probes_total`)."""
    with urllib.request.urlopen(gateway + "/metrics", timeout=5) as r:
        text = r.read().decode()
    head = f'flotilla_gateway_probes_total{{cluster="{cluster}",kind="request",result="'
    out = {}
    for line in text.splitlines():
        if line.startswith(head):
            result, value = line[len(head):].split('"} ')
            out[result] = int(float(value))
    return out


@pytest.fixture(scope="module")
def outage_fleet():
    procs = []
    try:
        sims = {}
        for name, model in (("primary", "m"), ("backup", "m-fb")):
            argv = [ENGINESIM, "--listen", "127.0.0.1:0", "--name", name, "--model", model, "--default-tokens", "4"]
            proc, sims[name] = _start(argv)
            procs.append(proc)
        table = (
            "clusters:\n"
            f"  - {{name: primary, url: \"{sims['primary']}\", jurisdiction: EU, region: eu-central-1}}\n"
            f"  - {{name: backup, url: \"{sims['backup']}\", jurisdiction: EU, region: eu-west-3}}\n"
            "models:\n"
            "  - {name: m, fallbacks: [m-fb], routes: [{cluster: primary}]}\n"
            "  - {name: m-fb, routes: [{cluster: backup}]}\n"
        )
        proc, url = _start([
            GATEWAY, "--listen", "127.0.0.1:0", "--config", _routing_file(table, "flotilla-gw-outage-"),
            "--breaker-failures", str(BREAKER_FAILURES),
            "--backoff-base-ms", "20", "--scrape-interval-ms", "0", "--allow-anonymous",
        ])
        procs.append(proc)
        yield {"gateway": url, **sims}
    finally:
        _stop(procs)


def _ask(client, i):
    """Request `i` (even: plain, odd: streamed); (cluster, model) that served it, read from the
    gateway's headers, after checking the answer is whole."""
    if i % 2 == 0:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
        resp = raw.parse()
        assert resp.choices[0].message.content
        assert resp.usage.completion_tokens == 4
    else:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(raw.parse())
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].usage.completion_tokens == 4
    return raw.headers["x-flotilla-cluster"], raw.headers["x-flotilla-model"]


def test_a_primary_down_for_a_minute_is_covered_by_the_fallback_and_taken_back_by_the_probe(outage_fleet):
    import openai

    f = outage_fleet
    client = openai.OpenAI(base_url=f["gateway"] + "/v1", api_key="none", max_retries=0, timeout=10)
    assert _ask(client, 0) == ("primary", "m")
    assert _ask(client, 1) == ("primary", "m")

    started = time.monotonic()  # the outage ends at least OUTAGE_S after this
    assert _post(f["primary"] + "/sim/model", {"model": "m", "down_ms": OUTAGE_S * 1000}) == 204
    served = []  # (seconds since `started`, cluster, model)
    i = 0
    while True:
        i += 1
        # Any exception here is a client-visible failure: max_retries=0 hides none.
        cluster, model = _ask(client, i)
        served.append((time.monotonic() - started, cluster, model))
        back = [t for t, c, _ in served if c == "primary" and t >= OUTAGE_S]
        if back and served[-1][0] >= back[0] + 2:
            break  # back on the primary, and a couple of seconds' traffic after that
        assert served[-1][0] < OUTAGE_S + RECOVERY_BOUND_S + 5, "traffic never came back to the primary"
        time.sleep(PACE_S)

    during = [s for s in served if s[0] < OUTAGE_S]
    assert during and all(c == "backup" and m == "m-fb" for _, c, m in during), "the fallback served the outage"
    first_back = next(t for t, c, _ in served if c == "primary")
    print(f"outage: {len(during)} requests on the fallback; back on the primary {first_back - OUTAGE_S:.1f} s after")
    # Measured from the earliest moment the outage can have ended, so never flattered.
    assert first_back - OUTAGE_S <= RECOVERY_BOUND_S, f"back on the primary {first_back - OUTAGE_S:.1f} s late"
    after = [s for s in served if s[0] >= first_back]
    assert len(after) >= 4 and all(c == "primary" and m == "m" for _, c, m in after), "and it stays there"

    # The engines' own counts: the down primary refused only the requests that opened its
    # circuit (no half-open request ran out onto it while down) and the probe's one-token
    # requests (`m` is left out of its list, so the probe asks it), and answered every one after.
    asked = _probe_requests(f["gateway"], "primary")
    assert asked.get("failed", 0) >= 1, asked
    primary = _get(f["primary"] + "/sim/streams/m")
    assert primary["requests"] - primary["planned"] == BREAKER_FAILURES + asked.get("failed", 0), asked
    assert primary["planned"] == 2 + len(after) + asked.get("ok", 0), asked
    backup = _get(f["backup"] + "/sim/streams/m-fb")
    assert backup["requests"] == backup["planned"] == len(served) - len(after)
