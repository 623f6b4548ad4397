"""What reaches the upstream: credentials, usage requests, parameters, limits, and the
Anthropic translation of messages, system prompts, tools, tool calls and stop reasons."""

from __future__ import annotations

import orjson

from tests.support.fake_anthropic import TOOL_INPUT_PARTS
from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS
from tests.support.inference import ANTHROPIC_CREDENTIAL, OPENAI_CREDENTIAL, sse_payloads

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_openai_stream_sends_credential_and_asks_for_usage(http, fake_openai):
    response = http.post(
        "/v1/chat/completions",
        json={
            "model": "oa/normal",
            "stream": True,
            "messages": [{"role": "user", "content": "marker-usage-31c"}],
        },
    )
    assert response.status_code == 200
    [sent] = fake_openai.sent(marker="marker-usage-31c")
    assert sent.headers["authorization"] == f"Bearer {OPENAI_CREDENTIAL}"
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert sent.body["model"] == "normal"  # the configured upstream name
    # The client did not ask for usage: as from OpenAI, no chunk carries it.
    chunks = [p for p in sse_payloads(response.content) if p != "[DONE]"]
    assert chunks and all("usage" not in chunk for chunk in chunks)
    assert all(chunk["choices"] for chunk in chunks)


def test_generation_parameters_pass_through(http, fake_openai):
    params = {
        "temperature": 0.3,
        "top_p": 0.9,
        "stop": ["END"],
        "seed": 7,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "max_tokens": 50,
        "response_format": {"type": "json_object"},
        "user": "user-1",
        "logit_bias": {"42": -1.0},
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
    }
    response = http.post(
        "/v1/chat/completions",
        json={"model": "oa/normal", "messages": [{"role": "user", "content": "marker-p-9d"}]}
        | params,
    )
    assert response.status_code == 200
    [sent] = fake_openai.sent(marker="marker-p-9d")
    for name, value in params.items():
        assert sent.body[name] == value, name
    assert "stream_options" not in sent.body


def test_output_limit_is_the_models_at_most(http, fake_openai):
    asked = {"model": "oa/small", "messages": [{"role": "user", "content": "marker-lim-1"}]}
    assert http.post("/v1/chat/completions", json=asked | {"max_tokens": 1000}).status_code == 200
    assert http.post("/v1/chat/completions", json=asked).status_code == 200
    assert http.post(
        "/v1/responses", json={"model": "oa/small", "input": "marker-lim-1"}
    ).is_success
    capped, defaulted, responses = fake_openai.sent(marker="marker-lim-1")
    assert capped.body["max_tokens"] == 64
    assert defaulted.body["max_completion_tokens"] == 64
    assert responses.body["max_output_tokens"] == 64


def test_anthropic_request_translation(http, fake_anthropic):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": [{"type": "text", "text": "Use metric units."}]},
        {"role": "user", "content": "marker-an-tr What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny, 21 C"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    response = http.post(
        "/v1/chat/completions",
        json={
            "model": "an/normal",
            "messages": messages,
            "tools": [WEATHER_TOOL],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "temperature": 1.5,
            "top_p": 0.5,
            "stop": "END",
            "max_tokens": 100,
            "user": "user-7",
        },
    )
    assert response.status_code == 200, response.text
    [sent] = fake_anthropic.sent(marker="marker-an-tr")
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == ANTHROPIC_CREDENTIAL
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    body = sent.body
    assert body["model"] == "normal"
    assert body["system"] == "You are terse.\n\nUse metric units."
    assert body["max_tokens"] == 100
    assert body["temperature"] == 1.0  # Anthropic's range ends at 1
    assert body["top_p"] == 0.5
    assert body["stop_sequences"] == ["END"]
    assert body["metadata"] == {"user_id": "user-7"}
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "marker-an-tr What is the weather in Paris?"}],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]


def test_anthropic_tool_call_answer(client):
    done = client.chat.completions.create(
        model="an/tool-call",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    [call] = choice.message.tool_calls
    assert call.id == "toolu_fake1"
    assert call.function.name == "get_weather"
    assert orjson.loads(call.function.arguments) == {"city": "Paris"}
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)


def test_anthropic_tool_call_stream(client):
    chunks = list(
        client.chat.completions.create(
            model="an/tool-call",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER_TOOL],
            stream=True,
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [call for d in deltas for call in d.tool_calls or ()]
    assert calls[0].id == "toolu_fake1" and calls[0].function.name == "get_weather"
    assert {call.index for call in calls} == {0}
    assert "".join(call.function.arguments or "" for call in calls) == "".join(TOOL_INPUT_PARTS)
    assert "".join(d.content or "" for d in deltas) == "Let me check."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_anthropic_stop_reason_length(client):
    done = client.chat.completions.create(
        model="an/length", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert done.choices[0].finish_reason == "length"
    response = client.responses.create(model="an/length", input="Hi", max_output_tokens=16)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"


def test_responses_tools_round_trip_over_anthropic(client, fake_anthropic):
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    first = client.responses.create(
        model="an/tool-call", input="marker-rt-5 Weather in Paris?", tools=[tool]
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.name, orjson.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert first.output_text == "Let me check."
    second = client.responses.create(
        model="an/tool-call",
        input=[
            {"role": "user", "content": "marker-rt-5 Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
        ],
        tools=[tool],
    )
    assert second.output_text == "The tool said: sunny"
    sent = fake_anthropic.sent(marker="marker-rt-5")[-1].body
    assert sent["messages"][1]["content"][0]["type"] == "tool_use"
    assert sent["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": calls[0].call_id,
        "content": "sunny",
    }


def test_responses_stream_with_a_tool_call(client):
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    with client.responses.stream(model="an/tool-call", input="Paris?", tools=[tool]) as stream:
        names = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in names
    assert "response.function_call_arguments.done" in names
    [call] = [item for item in final.output if item.type == "function_call"]
    assert call.name == "get_weather"
    assert orjson.loads(call.arguments) == {"city": "Paris"}
