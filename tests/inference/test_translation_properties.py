"""Whatever request the decoder accepts, the translations the gateway runs on it (Responses
to chat, chat to Anthropic Messages, the prompt text it counts) either succeed or refuse
it as invalid_request: never another exception, which would be a 500. In process, on
the real decoders and translators; tests/e2e/test_fuzz.py does the same over HTTP."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_gateway.gateway.inference.handlers import upstream_chat
from model_gateway.gateway.inference.responses_translate import chat_request
from model_gateway.gateway.inference.schemas import ChatRequest, ResponsesRequest
from model_gateway.gateway.inference.tokens import chat_prompt_text, responses_prompt_text
from model_gateway.gateway.providers.anthropic.anthropic_messages import messages_request
from model_gateway.pipeline.errors import InvalidRequest
from model_gateway.pipeline.validation import decoder
from tests.inference.request_strategies import chat_body, responses_body, with_wrong_types

decode_chat = decoder(ChatRequest)
decode_responses = decoder(ResponsesRequest)
PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Model:
    upstream = "upstream-model"
    max_output_tokens = 64


def _decoded(decode, body: dict) -> dict | None:
    """The request as the handlers get it, or None when the decoder refused it (a 400)."""
    try:
        return msgspec.to_builtins(decode(json.dumps(body).encode()))
    except InvalidRequest:
        return None


def _to_anthropic(chat: dict) -> None:
    try:
        messages_request(upstream_chat(chat, _Model(), "m", stream=False))
    except InvalidRequest:
        pass  # refused with a param: a 400 the client can act on


@PROPERTY
@given(body=st.one_of(chat_body, with_wrong_types(chat_body)))
def test_any_accepted_chat_request_translates_or_is_invalid(body):
    request = _decoded(decode_chat, body)
    if request is None:
        return
    chat_prompt_text(request)
    _to_anthropic(request)


@PROPERTY
@given(body=st.one_of(responses_body, with_wrong_types(responses_body)))
def test_any_accepted_responses_request_translates_or_is_invalid(body):
    request = _decoded(decode_responses, body)
    if request is None:
        return
    responses_prompt_text(request)
    try:
        chat = chat_request(request)
    except InvalidRequest:
        return
    _to_anthropic(chat)


@pytest.mark.parametrize("body", [{"model": "m", "input": "hi"}])
def test_the_property_reaches_the_translators(body):
    """The properties above are empty if nothing passes the decoder: one that does."""
    request = _decoded(decode_responses, body)
    assert request is not None
    assert messages_request(upstream_chat(chat_request(request), _Model(), "m", stream=False))
