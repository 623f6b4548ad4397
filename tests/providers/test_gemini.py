"""The gemini kind through a real `gateway serve` in front of the fake Gemini API (which
checks the key header, the bodies and the thought signatures as Google does): chat and
Responses, plain and streamed, with the official openai SDK; tools both ways; usage by
class; exact receipts; upstream failures, a rejected key and its fallback, a missing
key; streams cut or malformed; embeddings through POST /v1/embeddings."""

from __future__ import annotations

import json

import httpx
import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens
from tests.support.chat_requests import PROMPT
from tests.support.chat_requests import chat as _chat
from tests.support.chat_requests import finishes as _finishes
from tests.support.chat_requests import logged as _logged
from tests.support.chat_requests import marker as _marker
from tests.support.chat_requests import stream_text as _stream_text
from tests.support.errors import assert_error
from tests.support.fake_gemini import (
    BLOCKED,
    CACHED_TOKENS,
    COST,
    GEMINI_KEY,
    MODES,
    SAFETY,
    SKIP_SIGNATURE,
    STREAM_ERROR,
    THOUGHT,
    THOUGHT_SIGNATURE,
    THOUGHT_TOKENS,
    TO_ECHO,
    FakeGemini,
    embedding_of,
    model_block,
)
from tests.support.fake_upstream import (
    INPUT_TOKENS,
    MALFORMED,
    OUTPUT_TOKENS,
    REPLY,
    REPLY_PIECES,
    SECRET,
)
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import NO_BREAKER, sse_payloads

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
EMBED_PRICE = "0.15"  # per million input tokens


def _embedding_model(model_id: str, upstream: str) -> str:
    return f"""
[models."{model_id}"]
provider = "gem"
upstream = "{upstream}"
mode = "embedding"
input_price_per_mtok = "{EMBED_PRICE}"
"""


@pytest.fixture(scope="module")
def fake():
    with FakeGemini() as fake:
        yield fake


@pytest.fixture(scope="module")
def gw(tmp_path_factory, fake):
    block, env = fake.provider_config("gem")
    config = block + NO_BREAKER
    config += f"""
[providers.gem-badkey]
kind = "gemini"
base_url = "{fake.url}"
api_key_env = "FAKE_GEMINI_WRONG_KEY"

[providers.gem-unset]
kind = "gemini"
base_url = "{fake.url}"
api_key_env = "GATEWAY_TEST_VARIABLE_NEVER_SET"
"""
    config += "".join(model_block(f"g/{mode}", "gem", mode) for mode in MODES)
    config += model_block("g/badkey", "gem-badkey", "normal")
    config += model_block("g/badkey-falls-back", "gem-badkey", "normal", TO_ECHO)
    config += model_block("g/401-falls-back", "gem", "fault-401", TO_ECHO)
    config += model_block("g/unset", "gem-unset", "normal")
    config += _embedding_model("g-embed/normal", "normal")
    config += _embedding_model("g-embed/malformed", MALFORMED)
    env = {**env, "FAKE_GEMINI_WRONG_KEY": "AIza-not-the-key"}
    process = GatewayProcess(tmp_path_factory.mktemp("gemini"), extra_config=config, env=env)
    yield process.start()
    process.stop()


# --- chat and Responses ----------------------------------------------------------------------


def test_chat_translates_both_ways(client, fake):
    marker = _marker()
    done = client.chat.completions.create(
        model="g/normal",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"{PROMPT} {marker}"},
        ],
        temperature=0.4,
        top_p=0.9,
        stop=["END"],
        max_tokens=100,
    )
    assert done.model == "g/normal"
    assert done.choices[0].message.content == REPLY
    assert done.choices[0].finish_reason == "stop"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    [sent] = fake.sent(marker=marker)
    assert sent.path == "/v1beta/models/normal:generateContent"
    assert sent.headers["x-goog-api-key"] == GEMINI_KEY
    assert sent.body == {
        "contents": [{"role": "user", "parts": [{"text": f"{PROMPT} {marker}"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {
            "maxOutputTokens": 100,
            "temperature": 0.4,
            "topP": 0.9,
            "stopSequences": ["END"],
        },
    }


def test_chat_stream(client, fake):
    marker = _marker()
    chunks = list(
        client.chat.completions.create(
            **_chat("g/normal", f"{PROMPT} {marker}"),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert _stream_text(chunks) == REPLY
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert _finishes(chunks) == ["stop"]
    assert all(c.model == "g/normal" for c in chunks)
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    [sent] = fake.sent(marker=marker)
    assert sent.path == "/v1beta/models/normal:streamGenerateContent"  # (with ?alt=sse)


def test_responses(client):
    response = client.responses.create(model="g/normal", input=PROMPT)
    assert response.status == "completed" and response.model == "g/normal"
    assert response.output_text == REPLY
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)


def test_responses_stream(client):
    events = list(client.responses.create(model="g/normal", input=PROMPT, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == REPLY and len(deltas) > 1
    final = events[-1].response
    assert final.output_text == REPLY
    assert (final.usage.input_tokens, final.usage.output_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)


# --- tools -------------------------------------------------------------------------------


def test_tool_call_then_its_result(client, fake):
    marker = _marker()
    messages = [{"role": "user", "content": f"Weather in Paris? {marker}"}]
    done = client.chat.completions.create(model="g/tool-call", messages=messages, tools=[WEATHER])
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The SDK keeps the call as it came, its thought signature included.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
    after = client.chat.completions.create(model="g/tool-call", messages=messages, tools=[WEATHER])
    assert after.choices[0].message.content == "The tool said: sunny"
    assert after.choices[0].finish_reason == "stop"
    first, second = fake.sent(marker=marker)
    parameters = WEATHER["function"]["parameters"]
    declaration = {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parametersJsonSchema": parameters,
    }
    assert first.body["tools"] == [{"functionDeclarations": [declaration]}]
    assert "toolConfig" not in first.body
    call_part = {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}
    result_part = {"functionResponse": {"name": "get_weather", "response": {"content": "sunny"}}}
    assert second.body["contents"][1:] == [
        {"role": "model", "parts": [{**call_part, "thoughtSignature": THOUGHT_SIGNATURE}]},
        {"role": "user", "parts": [result_part]},
    ]


def test_a_replayed_call_without_its_signature_skips_the_check(client, fake):
    """A call the client kept without extra_content (or another model made): Gemini 3 would
    refuse it unsigned (the fake does too)."""
    marker = _marker()
    call = {
        "id": "call_from_elsewhere",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    messages = [
        {"role": "user", "content": f"Weather in Oslo? {marker}"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_from_elsewhere", "content": "snow"},
    ]
    done = client.chat.completions.create(model="g/tool-call", messages=messages, tools=[WEATHER])
    assert done.choices[0].message.content == "The tool said: snow"
    [sent] = fake.sent(marker=marker)
    assert sent.body["contents"][1]["parts"] == [
        {"text": "Let me look."},
        {
            "functionCall": {"name": "get_weather", "args": {"city": "Oslo"}},
            "thoughtSignature": SKIP_SIGNATURE,
        },
    ]


def test_tool_call_streamed(client):
    chunks = list(
        client.chat.completions.create(
            model="g/tool-call",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER],
            stream=True,
        )
    )
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert [(tc.index, tc.function.name) for tc in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert calls[0].id
    assert _finishes(chunks) == ["tool_calls"]


@pytest.mark.parametrize(
    ("choice", "config"),
    [
        ("auto", {"mode": "AUTO"}),
        ("required", {"mode": "ANY"}),
        ("none", {"mode": "NONE"}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"mode": "ANY", "allowedFunctionNames": ["get_weather"]},
        ),
    ],
)
def test_tool_choice(client, fake, choice, config):
    marker = _marker()
    client.chat.completions.create(**_chat("g/normal", marker), tools=[WEATHER], tool_choice=choice)
    [sent] = fake.sent(marker=marker)
    assert sent.body["toolConfig"] == {"functionCallingConfig": config}


def test_a_tool_result_answers_a_call_of_the_conversation(http, fake):
    marker = _marker()
    messages = [
        {"role": "user", "content": marker},
        {"role": "tool", "tool_call_id": "call_unknown", "content": "sunny"},
    ]
    body = {"model": "g/normal", "messages": messages, "tools": [WEATHER]}
    response = http.post("/v1/chat/completions", json=body)
    assert_error(response, 400, "invalid_request", param="messages.1.tool_call_id")
    assert fake.sent(marker=marker) == []


def test_json_output_and_sampling(client, fake):
    marker = _marker()
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    client.chat.completions.create(
        **_chat("g/normal", marker),
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        seed=7,
        presence_penalty=0.5,
        frequency_penalty=0.25,
    )
    client.chat.completions.create(
        **_chat("g/normal", marker), response_format={"type": "json_object"}
    )
    schema_asked, json_asked = (r.body["generationConfig"] for r in fake.sent(marker=marker))
    assert schema_asked == {
        "maxOutputTokens": 256,  # the model's limit: the request set none
        "seed": 7,
        "presencePenalty": 0.5,
        "frequencyPenalty": 0.25,
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
    }
    assert json_asked == {"maxOutputTokens": 256, "responseMimeType": "application/json"}


def test_image_parts_are_refused_before_anything_is_sent(http, fake):
    marker = _marker()
    content = [
        {"type": "text", "text": marker},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    body = {"model": "g/normal", "messages": [{"role": "user", "content": content}]}
    response = http.post("/v1/chat/completions", json=body)
    assert_error(response, 400, "invalid_request", param="messages.0.content.1")
    assert fake.sent(marker=marker) == []


# --- usage, receipts, length -----------------------------------------------------------------


def test_usage_by_class(client):
    done = client.chat.completions.create(**_chat("g/cached"))
    assert done.choices[0].message.content == REPLY  # the thought is not shown
    usage = done.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    assert usage.prompt_tokens_details.cached_tokens == CACHED_TOKENS
    assert usage.completion_tokens_details.reasoning_tokens == THOUGHT_TOKENS


def test_usage_by_class_streamed(client):
    chunks = list(
        client.chat.completions.create(
            **_chat("g/cached"), stream=True, stream_options={"include_usage": True}
        )
    )
    assert _stream_text(chunks) == REPLY and THOUGHT not in _stream_text(chunks)
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    assert usage.prompt_tokens_details.cached_tokens == CACHED_TOKENS
    assert usage.completion_tokens_details.reasoning_tokens == THOUGHT_TOKENS


def test_usage_by_class_on_responses(client):
    usage = client.responses.create(model="g/cached", input=PROMPT).usage
    assert usage.input_tokens_details.cached_tokens == CACHED_TOKENS
    assert usage.output_tokens_details.reasoning_tokens == THOUGHT_TOKENS


@pytest.mark.parametrize("model", ["g/normal", "g/cached"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_receipt_costs_usage_at_the_model_prices(http, model, stream):
    response = http.post("/v1/chat/completions", json=_chat(model, stream=stream))
    assert response.status_code == 200
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "succeeded" and receipt["usage_source"] == "provider"
    usage = receipt["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (INPUT_TOKENS, OUTPUT_TOKENS)
    assert receipt["cost"] == COST


def test_length(client):
    done = client.chat.completions.create(**_chat("g/length"))
    assert done.choices[0].finish_reason == "length"
    assert done.choices[0].message.content == "".join(REPLY_PIECES[:2])


def test_length_streamed(client):
    chunks = list(client.chat.completions.create(**_chat("g/length"), stream=True))
    assert _finishes(chunks) == ["length"]
    assert _stream_text(chunks) == "".join(REPLY_PIECES[:2])


@pytest.mark.parametrize(("mode", "text"), [(BLOCKED, ""), (SAFETY, REPLY_PIECES[0])])
def test_googles_filters_are_content_filter(client, mode, text):
    done = client.chat.completions.create(**_chat(f"g/{mode}"))
    assert done.choices[0].finish_reason == "content_filter"
    assert done.choices[0].message.content == text
    assert done.usage.prompt_tokens == INPUT_TOKENS
    chunks = list(client.chat.completions.create(**_chat(f"g/{mode}"), stream=True))
    assert _finishes(chunks) == ["content_filter"] and _stream_text(chunks) == text


# --- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("mode", ["fault-401", "fault-403", "fault-429", "fault-500", "badkey"])
def test_upstream_refusals_are_provider_errors(gw, http, mode, stream):
    response = http.post("/v1/chat/completions", json=_chat(f"g/{mode}", stream=stream))
    error = assert_error(response, 502, "provider_error")
    assert SECRET not in response.text and SECRET not in gw.log()
    if mode in ("fault-401", "fault-403", "badkey"):
        provider = "gem-badkey" if mode == "badkey" else "gem"
        assert _logged(gw, f"credentials rejected by provider {provider}")
        assert _logged(gw, error["request_id"])


def test_another_400_is_the_clients(gw, http):
    response = http.post("/v1/chat/completions", json=_chat("g/fault-400"))
    assert_error(response, 400, "invalid_request")
    assert SECRET not in response.text and SECRET not in gw.log()


@pytest.mark.parametrize("model", ["g/badkey-falls-back", "g/401-falls-back"])
def test_rejected_credentials_fall_back(gw, http, fake, model):
    marker = _marker()
    response = http.post("/v1/chat/completions", json=_chat(model, marker))
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-provider"] == "local"
    assert response.json()["choices"][0]["message"]["content"] == marker  # the echo's
    [refused] = fake.sent(marker=marker)
    wrong_key = model == "g/badkey-falls-back"
    assert (refused.headers["x-goog-api-key"] == GEMINI_KEY) != wrong_key
    provider = "gem-badkey" if wrong_key else "gem"
    assert _logged(gw, f"credentials rejected by provider {provider}")


def test_missing_key_is_not_configured(http, fake):
    marker = _marker()
    response = http.post("/v1/chat/completions", json=_chat("g/unset", marker))
    assert_error(response, 503, "service_unavailable")
    assert fake.sent(marker=marker) == []


def _in_band_errors(response: httpx.Response) -> list[str]:
    payloads = [p for p in sse_payloads(response.content) if isinstance(p, dict)]
    return [p["error"]["type"] for p in payloads if "error" in p]


def test_cut_mid_stream(http):
    response = http.post("/v1/chat/completions", json=_chat("g/cut-mid-stream", stream=True))
    assert response.status_code == 200
    assert _in_band_errors(response) == ["provider_error"]
    texts = [
        p["choices"][0]["delta"].get("content") or ""
        for p in sse_payloads(response.content)
        if isinstance(p, dict) and p.get("choices")
    ]
    assert "".join(texts) == "".join(REPLY_PIECES[:3])
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "failed"


def test_an_error_in_the_stream(gw, http):
    response = http.post("/v1/chat/completions", json=_chat(f"g/{STREAM_ERROR}", stream=True))
    assert response.status_code == 200
    assert _in_band_errors(response) == ["provider_error"]
    assert SECRET not in response.text and SECRET not in gw.log()


def test_cut_mid_answer(http):
    response = http.post("/v1/chat/completions", json=_chat("g/cut-mid-stream"))
    assert_error(response, 502, "provider_error")


def test_malformed_answer(gw, http):
    response = http.post("/v1/chat/completions", json=_chat(f"g/{MALFORMED}"))
    assert_error(response, 502, "provider_error")
    streamed = http.post("/v1/chat/completions", json=_chat(f"g/{MALFORMED}", stream=True))
    assert streamed.status_code == 200  # its first event was fine: the error is in band
    assert _in_band_errors(streamed) == ["provider_error"]
    assert b"internal_error" not in response.content + streamed.content


# --- embeddings ------------------------------------------------------------------------------


def test_embeddings(client, http, fake):
    marker = _marker()
    texts = [f"first {marker}", "second text"]
    result = client.embeddings.create(
        model="g-embed/normal", input=texts, dimensions=4, encoding_format="float"
    )
    assert [d.embedding for d in result.data] == [embedding_of(t, 4) for t in texts]
    assert [d.index for d in result.data] == [0, 1]
    assert result.model == "g-embed/normal"
    tokens = estimate_tokens("".join(texts))
    assert result.usage.prompt_tokens == result.usage.total_tokens == tokens
    [sent] = fake.sent(marker=marker)
    assert sent.path == "/v1beta/models/normal:batchEmbedContents"
    assert sent.headers["x-goog-api-key"] == GEMINI_KEY
    assert sent.body == {
        "requests": [
            {
                "model": "models/normal",
                "content": {"parts": [{"text": t}]},
                "outputDimensionality": 4,
            }
            for t in texts
        ]
    }


def test_embeddings_sdk_default_and_receipt(http, client):
    # The SDK asks base64 by default and decodes it (float32: close, not equal).
    [item] = client.embeddings.create(model="g-embed/normal", input="one text").data
    assert item.embedding == pytest.approx(embedding_of("one text", 8), abs=1e-6)
    response = http.post("/v1/embeddings", json={"model": "g-embed/normal", "input": "one text"})
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    tokens = estimate_tokens("one text")
    # Gemini reports no count: the gateway's, and the receipt says whose it is.
    assert receipt["usage"]["input_tokens"] == tokens and receipt["usage_source"] == "gateway"
    assert receipt["cost"] == f"0.{-(-tokens * 150_000 // 1_000_000):06d}"


def test_embeddings_of_many_inputs_go_in_batches(http, fake):
    marker = _marker()
    texts = [f"{marker} {i}" for i in range(150)]
    response = http.post("/v1/embeddings", json={"model": "g-embed/normal", "input": texts})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["embedding"] for d in data] == [embedding_of(t, 8) for t in texts]
    assert [len(r.body["requests"]) for r in fake.sent(marker=marker)] == [100, 50]


def test_embeddings_take_text_only(http, fake):
    before = len(fake.requests)
    response = http.post("/v1/embeddings", json={"model": "g-embed/normal", "input": [1, 2, 3]})
    assert_error(response, 400, "invalid_request", param="input")
    assert len(fake.requests) == before


def test_embeddings_malformed_answer(http):
    response = http.post("/v1/embeddings", json={"model": "g-embed/malformed", "input": "x"})
    assert_error(response, 502, "provider_error")


def test_tool_use_prompt_tokens_are_input():
    """Tokens of tools Google ran for the request are billed as input (a review's finding)."""
    from model_gateway.gateway.providers.gemini.gemini_translate import chat_usage

    usage = chat_usage({"promptTokenCount": 10, "toolUsePromptTokenCount": 5})
    assert usage["prompt_tokens"] == 15
    assert (
        chat_usage({"promptTokenCount": 10, "toolUsePromptTokenCount": -1})["prompt_tokens"] is None
    )
