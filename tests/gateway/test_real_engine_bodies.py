"""Strict request bodies in front of a real engine (llama.cpp's `llama-server`,
tests/gateway/llama_fleet.py): bodies with wrong JSON types (`"stream": "true"`, a quoted
`max_tokens`) are refused by the gateway with a 400 naming the field and what to send, before
any engine is asked, so they never count against a route; a well-formed request is served
right after."""

import json
import re
import urllib.error
import urllib.request

import openai

from llama_fleet import GREEDY, Fleet, get, metric


def _post(url, body):
    """(status, JSON body) of a POST of `body` (a dict, sent as JSON)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_wrongly_typed_bodies_are_refused_before_any_engine_and_never_count_against_a_route():
    f = Fleet(gateway_args=("--scrape-interval-ms", "0", "--breaker-failures", "5"))
    try:
        url = f.gateway + "/v1/chat/completions"
        msgs = [{"role": "user", "content": "hi"}]
        bad = [
            ({"stream": "true"}, "`stream` must be a boolean"),
            ({"stream": "false"}, "`stream` must be a boolean"),
            ({"max_tokens": "16"}, "`max_tokens` must be an integer"),
            ({"temperature": "0"}, "`temperature` must be a number"),
            ({"stream_options": {"include_usage": "yes"}}, "`stream_options.include_usage` must be a boolean"),
            ({"messages": "hi"}, "`messages` must be an array"),
        ]
        for extra, says in bad:
            status, body = _post(url, {"model": "tiny", "messages": msgs, **extra})
            assert status == 400, (extra, body)
            assert body["error"]["type"] == "invalid_request_error" and says in body["error"]["message"], body
        _, page = get(f.gateway + "/metrics")
        attempts = [line for line in page.splitlines() if line.startswith("flotilla_gateway_upstream_attempts_total")]
        assert all(line.endswith(" 0") for line in attempts), f"no engine was asked:\n{attempts}"
        assert not re.search(r'^flotilla_gateway_circuit_open\{[^}]*\} 1$', page, re.M), "no circuit opened"
        # Each engine: nothing processed, nothing refused (its prompt counter is untouched).
        for name in f.engines:
            assert metric(get(f.url(name) + "/metrics")[1], "llamacpp:prompt_tokens_total") == 0, name
        # Through the SDK: its BadRequestError, with the gateway's words.
        try:
            f.client().chat.completions.create(model="tiny", messages=msgs, max_tokens="8")
        except openai.BadRequestError as e:
            assert "`max_tokens` must be an integer" in e.message and "without quotes" in e.message, e.message
        else:
            raise AssertionError("a string max_tokens was served")
        # A well-formed request right after is served.
        ok = f.client().chat.completions.create(model="tiny", messages=msgs, max_tokens=4, stream=False, **GREEDY)
        assert ok.usage.completion_tokens == 4
        status, body = _post(url, {"model": "tiny", "messages": msgs, "stream": False, "max_tokens": 4, **GREEDY})
        assert status == 200 and body["usage"]["completion_tokens"] == 4
    finally:
        f.stop()
