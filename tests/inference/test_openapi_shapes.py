"""Every object the gateway generates validates against OpenAI's published OpenAPI document
(the schemas the SDKs are generated from): completions, chunks, Responses and their stream
events, models; echo and every translation path (OpenAI-compatible, chat-only, Anthropic)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from tests.support.inference import sse_payloads

SCHEMAS = Path(__file__).parents[1] / "support" / "openapi" / "openai-schemas.json"
# Where the gateway generates the objects: echo, and every translation. The OpenAI-compatible
# provider's own API is passed through as the upstream wrote it (the fake's shapes, not ours).
CHAT_MODELS = ["echo-1", "an/normal"]
RESPONSES_MODELS = ["echo-1", "oa-chat/normal", "an/normal"]


@cache
def validator(name: str) -> Draft202012Validator:
    document = json.loads(SCHEMAS.read_text())
    return Draft202012Validator({"$ref": f"#/components/schemas/{name}", **document})


@cache
def event_schemas() -> dict[str, str]:
    """Stream event type -> its schema, from the document's ResponseStreamEvent union."""
    schemas = json.loads(SCHEMAS.read_text())["components"]["schemas"]
    found = {}
    for option in schemas["ResponseStreamEvent"]["anyOf"]:
        name = option["$ref"].rsplit("/", 1)[1]
        for event_type in schemas[name]["properties"]["type"].get("enum", []):
            found[event_type] = name
    return found


def check(name: str, instance: object) -> None:
    errors = sorted(validator(name).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "shape check"}], **extra}


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_a_chat_completion(http, model):
    done = http.post("/v1/chat/completions", json=chat(model))
    assert done.status_code == 200, done.text
    check("CreateChatCompletionResponse", done.json())


@pytest.mark.parametrize("model", CHAT_MODELS)
@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_completion_chunks(http, model, include_usage):
    body = chat(model, stream=True, stream_options={"include_usage": include_usage})
    done = http.post("/v1/chat/completions", json=body)
    assert done.status_code == 200, done.text
    payloads = sse_payloads(done.content)
    assert payloads[-1] == "[DONE]"
    for chunk in payloads[:-1]:
        check("CreateChatCompletionStreamResponse", chunk)


@pytest.mark.parametrize("model", RESPONSES_MODELS)
def test_a_response(http, model):
    done = http.post("/v1/responses", json={"model": model, "input": "shape check"})
    assert done.status_code == 200, done.text
    check("Response", done.json())


@pytest.mark.parametrize("model", RESPONSES_MODELS)
def test_response_stream_events(http, model):
    done = http.post("/v1/responses", json={"model": model, "input": "shape check", "stream": True})
    assert done.status_code == 200, done.text
    events = sse_payloads(done.content)
    assert events
    for event in events:
        check(event_schemas()[event["type"]], event)  # the variant: errors that say what
        check("ResponseStreamEvent", event)


def test_models(http):
    listed = http.get("/v1/models").json()
    check("ListModelsResponse", listed)
    check("Model", http.get("/v1/models/echo-1").json())
