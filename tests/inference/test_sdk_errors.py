"""The official SDK's error classes for the gateway's errors, before and inside streams."""

from __future__ import annotations

import openai
import pytest

from tests.support.fake_upstream import SECRET


def call(client: openai.OpenAI, endpoint: str, model: str, stream: bool = False):
    if endpoint == "chat":
        result = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], stream=stream
        )
    else:
        result = client.responses.create(model=model, input="Hi", stream=stream)
    return list(result) if stream else result


ENDPOINTS = pytest.mark.parametrize("endpoint", ["chat", "responses"])
STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])


@ENDPOINTS
@STREAMS
def test_401_is_authentication_error(gw, endpoint, stream):
    stranger = openai.OpenAI(
        base_url=gw.url + "/v1", api_key="proj_live_" + "A" * 32, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError) as caught:
        call(stranger, endpoint, "echo-1", stream)
    assert caught.value.status_code == 401
    assert caught.value.body["type"] == "invalid_api_key"


@ENDPOINTS
@STREAMS
def test_404_is_not_found_error(client, endpoint, stream):
    with pytest.raises(openai.NotFoundError) as caught:
        call(client, endpoint, "no-such-model", stream)
    assert caught.value.body["type"] == "model_not_found"
    assert caught.value.body["param"] == "model"


@ENDPOINTS
@STREAMS
def test_upstream_rejection_is_bad_request_error(client, endpoint, stream):
    with pytest.raises(openai.BadRequestError) as caught:
        call(client, endpoint, "an/fault-400", stream)
    assert caught.value.body["type"] == "invalid_request"
    assert SECRET not in caught.value.message


def test_validation_error_names_its_param(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="echo-1", messages=[])
    assert caught.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="echo-1",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                    ],
                }
            ],
        )
    assert caught.value.body["param"] == "messages.0.content.1"


@ENDPOINTS
@STREAMS
def test_provider_failure_is_a_server_error(client, endpoint, stream):
    with pytest.raises(openai.InternalServerError) as caught:
        call(client, endpoint, "oa/fault-500", stream)
    assert caught.value.status_code == 502
    assert caught.value.body["type"] == "provider_error"


@ENDPOINTS
@STREAMS
@pytest.mark.parametrize("model", ["unset/normal", "echo-off"])
def test_unconfigured_provider_or_unavailable_model_is_503(client, endpoint, stream, model):
    with pytest.raises(openai.InternalServerError) as caught:
        call(client, endpoint, model, stream)
    assert caught.value.status_code == 503
    assert caught.value.body["type"] == "service_unavailable"


@ENDPOINTS
def test_in_band_stream_error_raises_api_error(client, endpoint):
    received = []
    with pytest.raises(openai.APIError) as caught:
        stream = (
            client.chat.completions.create(
                model="oa/cut-mid-stream", messages=[{"role": "user", "content": "Hi"}], stream=True
            )
            if endpoint == "chat"
            else client.responses.create(model="oa/cut-mid-stream", input="Hi", stream=True)
        )
        for event in stream:
            received.append(event)
    assert received, "the error came before any output: not an in-band error"
    assert caught.value.body["type"] == "provider_error"
    assert caught.value.body["request_id"].startswith("req_")
