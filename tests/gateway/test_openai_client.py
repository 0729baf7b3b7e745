"""The official openai Python client against the gateway: plain and streamed completions,
`include_usage`, the mapping of gateway errors onto the SDK's exception classes, and a
mid-stream failure that the SDK raises as APIError instead of returning a truncated answer."""

import openai
import pytest

MESSAGES = [{"role": "user", "content": "Say something about fleets."}]


def test_non_streaming_chat(client):
    raw = client.chat.completions.with_raw_response.create(model="m-alias", messages=MESSAGES)
    assert raw.headers["x-flotilla-cluster"] == "eu-1"
    assert raw.headers["x-request-id"]
    resp = raw.parse()
    assert resp.model == "m"
    assert resp.choices[0].message.content
    assert resp.usage.completion_tokens == 6
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 6


def test_completions_and_models(client):
    resp = client.completions.create(model="m", prompt="once upon a time")
    assert resp.choices[0].text
    ids = [m.id for m in client.models.list()]
    assert ids == ["busy", "calm", "down", "flaky", "limited", "m", "m-alias"]


def test_streaming_with_include_usage(client):
    full = client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 6


def test_streaming_without_usage(client):
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_error_mapping(client, gateway_url):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 100}])
    assert e.value.code == "context_length_exceeded"

    bad_key = openai.OpenAI(base_url=gateway_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.chat.completions.create(model="m", messages=MESSAGES)

    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert e.value.code == "model_not_found"

    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="limited", messages=MESSAGES)
    assert e.value.response.headers["retry-after"] == "30"

    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="down", messages=MESSAGES)
    assert e.value.status_code == 503
    assert e.value.code == "no_healthy_cluster"
    assert e.value.response.headers["retry-after"]


def test_key_limits_map_onto_the_sdk(gateway_url):
    from conftest import LIMITED_KEY

    limited = openai.OpenAI(base_url=gateway_url + "/v1", api_key=LIMITED_KEY, max_retries=0, timeout=10)
    assert [m.id for m in limited.models.list()] == ["m", "m-alias"]
    with pytest.raises(openai.PermissionDeniedError) as e:
        limited.chat.completions.create(model="flaky", messages=MESSAGES)
    assert e.value.code == "model_not_allowed"
    for _ in range(2):
        limited.chat.completions.create(model="m", messages=MESSAGES)
    with pytest.raises(openai.RateLimitError) as e:
        limited.chat.completions.create(model="m", messages=MESSAGES)
    assert e.value.code == "rate_limit_exceeded"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 30


def test_mid_stream_failure_raises_api_error(client):
    stream = client.chat.completions.create(model="flaky", messages=MESSAGES, stream=True)
    received = []
    with pytest.raises(openai.APIError) as e:
        for chunk in stream:
            received.append(chunk)
    assert received, "the first tokens arrived before the failure"
    assert not isinstance(e.value, openai.APIConnectionError)
    assert "incomplete" in e.value.message


def test_one_models_rate_limit_leaves_its_neighbour_on_the_same_cluster_alone(client):
    # `busy` and `calm` are served by one engine; only `busy` answers 429 with Retry-After: 30.
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="busy", messages=MESSAGES)
    assert e.value.code == "rate_limit_exceeded"
    assert e.value.response.headers["retry-after"] == "30"
    for _ in range(3):
        r = client.chat.completions.create(model="calm", messages=MESSAGES)
        assert r.choices[0].message.content
    # While `busy` cools down its clients hear the remaining wait, not a 503.
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="busy", messages=MESSAGES)
    assert 20 <= int(e.value.response.headers["retry-after"]) <= 30
