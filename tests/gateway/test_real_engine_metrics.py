"""What the gateway reads from a real engine: llama.cpp's `llama-server --metrics` page
(tests/gateway/llama_fleet.py), whose `llamacpp:requests_deferred` is the engine's queue, steers
least-load routing away from an engine busy with requests that never passed through the
gateway."""

import threading
import time

from llama_fleet import GREEDY, MESSAGES, Fleet, get, metric


def test_an_engines_own_queue_steers_routing_away_from_it():
    f = Fleet(gateway_args=("--scrape-interval-ms", "100"))
    try:
        # Three long answers asked of llama-a directly (one slot: one runs, two wait).
        a = f.client(f.url("llama-a"))
        busy = [
            threading.Thread(target=lambda: a.chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=3000, **GREEDY), daemon=True)
            for _ in range(3)
        ]
        for t in busy:
            t.start()
        deadline = time.monotonic() + 10
        while metric(get(f.url("llama-a") + "/metrics")[1], "llamacpp:requests_deferred") < 2:
            assert time.monotonic() < deadline, "llama-a never queued the requests"
            time.sleep(0.02)
        time.sleep(0.5)  # a few scrapes
        # The gateway has nothing in flight anywhere: only the scraped queue tells them apart
        # (without it, least load ties and the first cluster by name, llama-a, is chosen).
        served = []
        for _ in range(3):
            raw = f.client().chat.completions.with_raw_response.create(
                model="tiny", messages=MESSAGES, max_tokens=4, **GREEDY
            )
            served.append(raw.headers["x-flotilla-cluster"])
        assert served == ["llama-b"] * 3, served
        for t in busy:
            t.join(timeout=30)
    finally:
        f.stop()
