"""What the gateway reads from a real engine: llama.cpp's `llama-server --metrics` page
(tests/gateway/llama_fleet.py), whose `llamacpp:requests_deferred` is the engine's queue, steers
least-load routing away from an engine busy with requests that never passed through the
gateway."""

import threading
import time

from llama_fleet import GREEDY, MESSAGES, Fleet, get, metric

# Long answers asked of llama-a directly: its one slot runs one, the others wait in its queue.
# A 3,000-token answer of the test model takes about 4 s on an idle core, so four of them keep
# the queue non-empty for over 10 s however the machine is loaded.
BUSY = 4


def _metrics(f):
    """llama-a's metrics page; empty when it does not answer in time (a busy single-core engine
    has once taken over 5 s: the caller's own deadline decides)."""
    try:
        return get(f.url("llama-a") + "/metrics", timeout=10)[1]
    except OSError:
        return ""


def test_an_engines_own_queue_steers_routing_away_from_it():
    f = Fleet(gateway_args=("--scrape-interval-ms", "100"))
    errors = []

    def busy_request():
        try:
            # One client each: no shared connection pool between the waiting requests.
            f.client(f.url("llama-a")).chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=3000, **GREEDY
            )
        except Exception as e:  # noqa: BLE001 - reported by the assertion below, or ignored at stop
            errors.append(repr(e))

    try:
        busy = [threading.Thread(target=busy_request, daemon=True) for _ in range(BUSY)]
        for t in busy:
            t.start()
        deadline = time.monotonic() + 30
        while True:
            page = _metrics(f)
            if metric(page, "llamacpp:requests_deferred") >= 1 and metric(page, "llamacpp:requests_processing") >= 1:
                break
            assert time.monotonic() < deadline, (
                f"llama-a never queued a request; busy requests' errors: {errors}; "
                f"its metrics:\n{page}\nits log ends:\n{f.log_tail('llama-a')}"
            )
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
        still_queued = metric(_metrics(f), "llamacpp:requests_deferred")
        assert served == ["llama-b"] * 3, (served, f"llama-a's queue now {still_queued}", errors)
        assert not errors, errors
    finally:
        f.stop()
