"""The gateway in front of a real engine: two llama.cpp `llama-server` processes (built from
source by scripts/build-llama-server.sh) serving the same tiny random-weight model
(scripts/make-test-gguf.py), seen through the official openai client. At temperature 0 the
gateway's answer, plain or streamed, has exactly the text and the usage the engine gives when
asked directly; the gateway's own errors and the engine's come back in the OpenAI shape; and
when the engine serving a stream is killed mid-answer the client gets either the whole
uninterrupted answer (continued on the other engine) or a clean error after a prefix of it:
never text repeated or spliced from another answer; a plain answer whose engine is killed is
asked again of the other. Without the binary every test here fails
and says how to build it: nothing is skipped."""

import json
import signal
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from llama_fleet import GREEDY, MESSAGES, Fleet, get, metric


@pytest.fixture(scope="module")
def fleet():
    f = Fleet()
    try:
        yield f
    finally:
        f.stop()


def _direct(fleet, name, **kw):
    return fleet.client(fleet.url(name)).chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY, **kw)


def _streamed(client, **kw):
    """(chunks, text) of a streamed chat answer with its usage chunk."""
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **GREEDY, **kw
        )
    )
    return chunks, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_both_engines_give_one_answer_and_the_gateway_passes_it_on_unchanged(fleet):
    a = _direct(fleet, "llama-a", max_tokens=32)
    b = _direct(fleet, "llama-b", max_tokens=32)
    assert a.choices[0].message.content, "the engine answered with text"
    assert a.choices[0].message.content == b.choices[0].message.content, "greedy decoding: one answer"
    assert a.usage.completion_tokens == 32, "the test model never stops early (scripts/make-test-gguf.py)"

    raw = fleet.client().chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=32, **GREEDY
    )
    assert raw.headers["x-flotilla-cluster"] in fleet.engines
    resp = raw.parse()
    assert resp.choices[0].message.content == a.choices[0].message.content
    assert resp.choices[0].finish_reason == a.choices[0].finish_reason == "length"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (
        a.usage.prompt_tokens, a.usage.completion_tokens, a.usage.total_tokens
    )


def test_a_streamed_answer_through_the_gateway_is_the_engines_answer(fleet):
    want = _direct(fleet, "llama-a", max_tokens=40)
    chunks, text = _streamed(fleet.client(), max_tokens=40)
    assert text == want.choices[0].message.content
    assert len({c.id for c in chunks}) == 1, "one answer, one id"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None, "the usage chunk comes last, as include_usage asks"
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        want.usage.prompt_tokens, want.usage.completion_tokens, want.usage.total_tokens
    )
    # Without include_usage the engine sends none, and the gateway adds none.
    plain = list(fleet.client().chat.completions.create(
        model="tiny", messages=MESSAGES, stream=True, max_tokens=8, **GREEDY
    ))
    assert all(c.usage is None for c in plain)


def test_completions_through_the_gateway_match_the_engine(fleet):
    direct = fleet.client(fleet.url("llama-b")).completions.create(
        model="tiny", prompt="Once upon a fleet", max_tokens=16, **GREEDY
    )
    via = fleet.client().completions.create(model="tiny", prompt="Once upon a fleet", max_tokens=16, **GREEDY)
    assert via.choices[0].text == direct.choices[0].text and via.choices[0].text
    assert via.usage.completion_tokens == direct.usage.completion_tokens == 16


def test_errors_come_back_in_the_openai_shape(fleet):
    client = fleet.client()
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert e.value.code == "model_not_found"
    assert "no-such-model" in e.value.message

    # A request the gateway passes on and the engine refuses: llama-server's 400, in the
    # OpenAI shape the SDK reads.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user"}], **GREEDY)
    assert e.value.status_code == 400
    assert "content" in e.value.message, "the engine's own words"
    # A body that is not JSON never reaches an engine.
    req = urllib.request.Request(
        fleet.gateway + "/v1/chat/completions", data=b"{not json", headers={"content-type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    body = json.loads(e.value.read())
    assert body["error"]["type"] == "invalid_request_error" and "JSON" in body["error"]["message"]

    # And the route is none the worse for it.
    ok = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, **GREEDY)
    assert ok.usage.completion_tokens == 4


# Sampled as far as the gateway can tell (temperature above 0, no seed), greedy for llama-server
# (top_k 1): the gateway continues such a request by prefill on a prefill route.
SAMPLED_GREEDY = {"temperature": 0.5, "extra_body": {"top_k": 1}}


def _continued(f, name, partial, max_tokens):
    """The text engine `name` streams after `partial` when asked to continue it (a prefill)."""
    chunks = list(f.client(f.url(name)).chat.completions.create(
        model="tiny", messages=MESSAGES + [{"role": "assistant", "content": partial}], stream=True,
        max_tokens=max_tokens, temperature=0.5,
        extra_body={"continue_final_message": True, "add_generation_prompt": False, "top_k": 1},
    ))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("continuation,sampled", [("regenerate", False), ("prefill", False), ("prefill", True)])
def test_killing_the_engine_mid_stream_gives_one_coherent_answer_or_a_clean_error(continuation, sampled):
    """A reproducible request (temperature 0 and a seed) is regenerated on either kind of route:
    the survivor answers again and only what follows the text sent is relayed, so a completed
    answer is exactly the uninterrupted one, with its usage. A sampled request on a `prefill`
    route: the survivor continues the text sent, so a completed answer is a prefix of the
    uninterrupted one (up to where the stream broke, at a chunk boundary) followed by exactly
    what the survivor gives when asked to continue that prefix; text repeated or lost at the
    seam fails both."""
    f = Fleet(continuation=continuation)
    try:
        max_tokens = 1500
        direct = _direct(f, "llama-b", max_tokens=max_tokens)
        want = direct.choices[0].message.content
        assert want == _direct(f, "llama-a", max_tokens=max_tokens).choices[0].message.content

        raw = f.client().chat.completions.with_raw_response.create(
            model="tiny", messages=MESSAGES, stream=True, stream_options={"include_usage": True},
            max_tokens=max_tokens, **(SAMPLED_GREEDY if sampled else GREEDY),
        )
        serving = raw.headers["x-flotilla-cluster"]
        survivor = next(n for n in f.engines if n != serving)
        stream = raw.parse()
        chunks, before = [], ""
        for chunk in stream:
            chunks.append(chunk)
            if chunk.choices:
                before += chunk.choices[0].delta.content or ""
            if len(before) >= 20:
                break
        f.engines[serving][0].send_signal(signal.SIGKILL)
        error = None
        try:
            for chunk in stream:
                chunks.append(chunk)
        except openai.APIError as e:
            error = e
        pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        text = "".join(pieces)
        assert text.startswith(before) and want.startswith(before)
        # The kill cut the stream (it was not over before the engine died).
        _, metrics = get(f.gateway + "/metrics")
        broken = [line for line in metrics.splitlines() if line.startswith("flotilla_gateway_streams_total")
                  and f'cluster="{serving}"' in line and any(f'end="{e}"' in line for e in ("cut", "truncated"))]
        assert any(not line.endswith(" 0") for line in broken), f"the stream on {serving} was cut:\n{metrics}"
        if error is not None:
            assert not isinstance(error, openai.APIConnectionError), "an error event, not a dropped connection"
            assert want.startswith(text), f"an interrupted answer is a prefix of the whole one ({error.code})"
            print(f"{continuation}: error {error.code} after {len(text)} of {len(want)} characters")
            return
        assert len({c.id for c in chunks}) == 1, "one answer, one id"
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == max_tokens
        if not sampled:
            assert text == want, "a regenerated answer is exactly the uninterrupted one"
            assert (usage.prompt_tokens, usage.completion_tokens) == (
                direct.usage.prompt_tokens, direct.usage.completion_tokens
            ), "the engine's own count of the uninterrupted answer: the client's prompt, every token once"
        else:
            # The seam is at a chunk boundary at or after what the client had at the kill.
            seams = [i for i in range(len(pieces), 0, -1)
                     if len("".join(pieces[:i])) >= len(before) and want.startswith("".join(pieces[:i]))]
            assert seams, "the answer begins with the interrupted one"
            for i in seams[:4]:
                head = "".join(pieces[:i])
                tokens = sum(1 for p in pieces[:i] if p)
                if _continued(f, survivor, head, max_tokens - tokens) == text[len(head):]:
                    break
            else:
                raise AssertionError("the answer after the seam is not the survivor's continuation of the text sent")
        print(f"{continuation}: completed on {survivor}, {len(before)} characters before the kill")
    finally:
        f.stop()


def test_killing_the_engine_during_a_plain_answer_retries_it_on_the_other():
    """A non-streamed answer has sent nothing when its engine dies: the gateway asks the other
    engine, and the client gets that engine's whole answer, the same text and usage."""
    f = Fleet()
    try:
        max_tokens = 3000
        want = _direct(f, "llama-b", max_tokens=max_tokens)
        result = {}

        def ask():
            try:
                result["raw"] = f.client().chat.completions.with_raw_response.create(
                    model="tiny", messages=MESSAGES, max_tokens=max_tokens, **GREEDY
                )
            except Exception as e:  # reported by the assertions below
                result["error"] = e

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        serving, deadline = None, time.monotonic() + 30
        while serving is None:
            assert time.monotonic() < deadline, "no engine started the answer"
            for name in f.engines:
                if metric(get(f.url(name) + "/metrics")[1], "llamacpp:requests_processing") >= 1:
                    serving = name
            time.sleep(0.02)
        f.engines[serving][0].send_signal(signal.SIGKILL)
        t.join(timeout=60)
        assert "error" not in result, result.get("error")
        raw = result["raw"]
        survivor = next(n for n in f.engines if n != serving)
        assert raw.headers["x-flotilla-cluster"] == survivor
        resp = raw.parse()
        assert resp.choices[0].message.content == want.choices[0].message.content
        assert resp.usage.completion_tokens == max_tokens
    finally:
        f.stop()
