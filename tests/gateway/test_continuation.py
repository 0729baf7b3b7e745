"""Mid-stream continuation seen through the official openai client: streams cut, stalled or
broken by a malformed event after their first tokens arrive whole (the engine's canonical
answer, one id, usage that adds up); a route refusing prefill regenerates; a non-deterministic
regeneration and an EU-only model whose EU clusters all break raise APIError instead of
returning a wrong or truncated answer. Attempts are read from each engine's counters."""

import json
import urllib.request

import openai
import pytest

MESSAGES = [{"role": "user", "content": "Tell me how fleets route answers."}]


def counters(url, model):
    with urllib.request.urlopen(f"{url}/sim/streams/{model}", timeout=5) as r:
        return json.load(r)


def canonical(sims, model, **extra):
    """The answer engine `a` gives without a fault (its faults apply to streams only)."""
    direct = openai.OpenAI(base_url=sims["a"] + "/v1", api_key="none", max_retries=0, timeout=10)
    return direct.chat.completions.create(model=model, messages=MESSAGES, **extra).choices[0].message.content


@pytest.fixture()
def gw(continuation_sims):
    return openai.OpenAI(base_url=continuation_sims["gateway"] + "/v1", api_key="none", max_retries=0, timeout=10)


def streamed(client, model):
    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


@pytest.mark.parametrize("model", ["cut", "stall"])
def test_a_broken_stream_is_finished_on_another_cluster(gw, continuation_sims, model):
    want = canonical(continuation_sims, model)
    chunks, text = streamed(gw, model)
    assert text == want
    assert len({c.id for c in chunks}) == 1, "one answer, one id"
    assert chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 10
    # Engine a: the canonical answer asked directly, then the stream that broke.
    assert counters(continuation_sims["a"], model)["requests"] == 2
    b = counters(continuation_sims["b"], model)
    assert (b["requests"], b["continuations"]) == (1, 1)


def test_a_malformed_event_is_skipped(gw, continuation_sims):
    want = canonical(continuation_sims, "malformed")
    _, text = streamed(gw, "malformed")
    assert text == want
    assert counters(continuation_sims["a"], "malformed")["requests"] == 2  # canonical, stream
    assert counters(continuation_sims["b"], "malformed")["requests"] == 0


def test_a_route_refusing_prefill_regenerates(gw, continuation_sims):
    want = canonical(continuation_sims, "refuse")
    chunks, text = streamed(gw, "refuse")
    assert text == want
    assert chunks[-1].usage.completion_tokens == 10
    b = counters(continuation_sims["b"], "refuse")
    assert (b["requests"], b["prefill_refused"], b["continuations"]) == (2, 1, 0)
    # Non-streamed answers of the same model are untouched by any of this.
    plain = gw.chat.completions.create(model="refuse", messages=MESSAGES)
    assert plain.choices[0].message.content == want


def test_a_nondeterministic_regeneration_raises_instead_of_a_wrong_answer(gw, continuation_sims):
    want = canonical(continuation_sims, "nondet")
    received = []
    with pytest.raises(openai.APIError) as e:
        for chunk in gw.chat.completions.create(model="nondet", messages=MESSAGES, stream=True):
            received.append(chunk)
    assert not isinstance(e.value, openai.APIConnectionError)
    assert e.value.code == "continuation_diverged"
    text = "".join(c.choices[0].delta.content or "" for c in received if c.choices)
    assert len(text.split()) == 3 and want.startswith(text), "only what engine a sent"
    assert counters(continuation_sims["b"], "nondet")["requests"] == 1


def test_an_eu_only_model_is_never_continued_in_the_us(gw, continuation_sims):
    received = []
    with pytest.raises(openai.APIError) as e:
        for chunk in gw.chat.completions.create(model="euonly", messages=MESSAGES, stream=True):
            received.append(chunk)
    assert e.value.code == "upstream_cut"
    assert received
    eu = [counters(continuation_sims[s], "euonly")["requests"] for s in ("a", "b")]
    assert eu == [1, 1]
    assert counters(continuation_sims["us"], "euonly")["requests"] == 0
