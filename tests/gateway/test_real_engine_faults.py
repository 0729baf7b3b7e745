"""Failover scenarios against the real engine (two llama.cpp `llama-server`s behind the gateway,
tests/gateway/llama_fleet.py), as failoverbench runs them: an engine stopped (SIGSTOP) before it
sends a byte, and an engine killed and started again. The client gets one coherent answer, the
one the surviving engine gives when asked directly, never a mix; the restarted engine takes
traffic again once it answers. (An engine killed mid-stream: test_real_engine.py.)"""

import signal
import time

from llama_fleet import GREEDY, MESSAGES, Fleet

# The gateway gives up on a silent engine after these (before any byte reached the client,
# so the request is asked again of the other engine).
TTFT_MS, REQUEST_MS = 1500, 3000


def _want(f, max_tokens):
    return f.client(f.url("llama-b")).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=max_tokens, **GREEDY
    ).choices[0].message.content


def _streamed(client, max_tokens):
    """(cluster, text) of a streamed answer through the gateway."""
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=max_tokens, stream=True, **GREEDY
    )
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    return raw.headers["x-flotilla-cluster"], text


def _plain(client, max_tokens):
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=MESSAGES, max_tokens=max_tokens, **GREEDY)
    return raw.headers["x-flotilla-cluster"], raw.parse().choices[0].message.content


def test_an_engine_stopped_before_its_first_byte_is_left_for_the_other():
    f = Fleet(gateway_args=("--scrape-interval-ms", "0", "--ttft-timeout-ms", str(TTFT_MS),
                            "--request-timeout-ms", str(REQUEST_MS)))
    stopped = f.engines["llama-a"][0]
    try:
        want = _want(f, 64)
        # Nothing in flight anywhere: least load ties and llama-a, first by name, is asked first.
        assert _plain(f.client(), 64) == ("llama-a", want)
        stopped.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        assert _streamed(f.client(), 64) == ("llama-b", want), "streamed: the other engine's whole answer"
        assert _plain(f.client(), 64) == ("llama-b", want), "plain: the other engine's whole answer"
        # Each waited for its own timeout at most once, not for the client's.
        assert time.monotonic() - began < (TTFT_MS + REQUEST_MS) / 1000 + 20
    finally:
        stopped.send_signal(signal.SIGCONT)
        f.stop()


def test_an_engine_killed_and_started_again_takes_traffic_again():
    f = Fleet()
    try:
        want = _want(f, 48)
        f.engines["llama-a"][0].send_signal(signal.SIGKILL)
        f.engines["llama-a"][0].wait(timeout=10)
        # Down: every answer is llama-b's, whole.
        for ask in (_plain, _streamed, _plain):
            assert ask(f.client(), 48) == ("llama-b", want)
        f.restart("llama-a")
        restarted = time.monotonic()
        served = []
        while True:
            cluster, text = (_plain if len(served) % 2 else _streamed)(f.client(), 48)
            assert text == want, (cluster, text)
            served.append(cluster)
            if cluster == "llama-a":
                break
            # The documented recovery bound (docs/gateway.md "Probes": within 10 s).
            assert time.monotonic() - restarted < 15, f"llama-a never took traffic again: {served}"
            time.sleep(0.25)
    finally:
        f.stop()
