"""In process: Messages requests as the neutral chat request, chat answers and streams as
Messages ones, and the pass-through of an Anthropic stream, on the real decoders,
translators and renderers."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_gateway.gateway.inference.handlers import upstream_chat
from model_gateway.gateway.inference.messages.messages_passthrough import MessagesPassThrough
from model_gateway.gateway.inference.messages.messages_schemas import MessagesRequest
from model_gateway.gateway.inference.messages.messages_stream import TranslatedMessagesRenderer
from model_gateway.gateway.inference.messages.messages_translate import (
    chat_from_messages,
    message_from_chat,
)
from model_gateway.gateway.inference.output_limit import Delivered
from model_gateway.gateway.inference.schemas import ChatRequest
from model_gateway.gateway.inference.tokens import estimate_tokens, messages_prompt_text
from model_gateway.gateway.inference.usage import Prompt
from model_gateway.gateway.providers.anthropic.messages_events import NativeMessagesEvents
from model_gateway.pipeline.errors import InvalidRequest
from model_gateway.pipeline.validation import decoder
from tests.inference.request_strategies import json_any, json_schema, name, short, with_wrong_types
from tests.support.inference import read_sse, relay, split

decode_messages = decoder(MessagesRequest)
decode_chat = decoder(ChatRequest)
PROMPT = Prompt("What the model reads.", 10_000)


class _Model:
    upstream = "upstream-model"
    max_output_tokens = 64


_text = st.fixed_dictionaries({"type": st.just("text"), "text": short})
_unknown = st.fixed_dictionaries(
    {"type": st.sampled_from(["thinking", "search_result", "future_block"])},
    optional={"thinking": short, "content": json_any, "cache_control": json_any},
)
tool_use_block = st.fixed_dictionaries(
    {"type": st.just("tool_use"), "id": name, "name": name, "input": st.dictionaries(name, short)}
)
_tool_result = st.fixed_dictionaries(
    {"type": st.just("tool_result"), "tool_use_id": name},
    optional={"content": st.one_of(short, st.lists(_text, max_size=2)), "is_error": st.booleans()},
)
_message = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.one_of(
                short, st.lists(st.one_of(_text, _tool_result, _unknown), max_size=3)
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.one_of(
                short, st.lists(st.one_of(_text, tool_use_block, _unknown), max_size=3)
            ),
        }
    ),
)
_tool = st.fixed_dictionaries(
    {"name": name, "input_schema": json_schema},
    optional={"description": short, "cache_control": json_any},
)
messages_body = st.fixed_dictionaries(
    {
        "model": st.just("echo-1"),
        "max_tokens": st.integers(1, 100),
        "messages": st.lists(_message, min_size=1, max_size=3),
    },
    optional={
        "system": st.one_of(short, st.lists(_text, max_size=2)),
        "tools": st.lists(_tool, min_size=1, max_size=2),
        "tool_choice": st.one_of(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["auto", "any", "none"])},
                optional={"disable_parallel_tool_use": st.booleans()},
            ),
            st.fixed_dictionaries({"type": st.just("tool"), "name": name}),
        ),
        "stop_sequences": st.lists(short, max_size=2),
        "temperature": st.floats(0, 1),
        "top_p": st.floats(0, 1),
        "top_k": st.integers(0, 10),
        "metadata": st.fixed_dictionaries({}, optional={"user_id": st.one_of(st.none(), short)}),
        "thinking": json_any,
        "stream": st.booleans(),
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.one_of(messages_body, with_wrong_types(messages_body)))
def test_an_accepted_request_is_a_valid_chat_request_for_every_other_upstream(body):
    raw = json.dumps(body).encode()
    try:
        decode_messages(raw)
    except InvalidRequest:
        return  # a 400 with its param
    request = orjson.loads(raw)
    messages_prompt_text(request)
    chat = upstream_chat(chat_from_messages(request), _Model(), "m", stream=False)
    if not chat["messages"]:
        return  # nothing a chat upstream reads (thinking alone): the upstream's 400
    decode_chat(orjson.dumps(chat))  # what chat's own endpoint accepts


def test_the_property_reaches_the_translation():
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    decode_messages(orjson.dumps(body))
    assert chat_from_messages(body)["messages"] == [{"role": "user", "content": "hi"}]


def test_a_conversation_with_tools_as_chat():
    request = {
        "model": "m",
        "max_tokens": 50,
        "system": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Let me see.", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P"}},
                ],
            },
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "And?"},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                    {"type": "text", "text": "Thanks."},
                ],
            },
        ],
        "tools": [{"name": "w", "input_schema": {"type": "object"}, "cache_control": {}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "top_k": 3,
        "metadata": {"user_id": "u"},
    }
    assert chat_from_messages(request) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "One.\n\nTwo."},
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "w", "arguments": '{"c":"P"}'},
                    }
                ],
            },
            # The tool's result right after the call, then the turn's text.
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "And?"}, {"type": "text", "text": "Thanks."}],
            },
        ],
        "max_completion_tokens": 50,
        "tools": [
            {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stop": ["END"],
        "user": "u",
    }


@pytest.mark.parametrize(
    ("choice", "chat"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "w"}, {"type": "function", "function": {"name": "w"}}),
    ],
)
def test_tool_choice_as_chat(choice, chat):
    request = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "w", "input_schema": {}}],
        "tool_choice": choice,
    }
    assert chat_from_messages(request)["tool_choice"] == chat


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
        (None, "end_turn"),
    ],
)
def test_stop_reasons(finish, stop):
    completion = {"choices": [{"message": {"content": "x"}, "finish_reason": finish}]}
    assert message_from_chat(completion, "m", {})["stop_reason"] == stop


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_a_chat_stream_as_messages_events_in_anthropics_order():
    renderer = TranslatedMessagesRenderer("m", PROMPT, Delivered(1000))
    usage = {
        "prompt_tokens": 20,
        "completion_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 6, "cache_write_tokens": 4},
    }
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "Let me "}),
        _chunk({"content": "look."}),
        _chunk(
            {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "a", "arguments": ""}}]}
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        _chunk(
            {"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "b", "arguments": "{}"}}]}
        ),
        _chunk({}, "content_filter"),
        {"choices": [], "usage": usage},
    ]
    raw = renderer.start() + b"".join(renderer.feed(c) for c in chunks) + renderer.finish()
    events = [(name, orjson.loads(data)) for name, data in read_sse(raw)]
    assert all(name == payload["type"] for name, payload in events)
    shapes = [
        (p["type"], p.get("index"), (p.get("delta") or p.get("content_block") or {}).get("type"))
        for _, p in events
    ]
    assert shapes == [
        ("message_start", None, None),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "tool_use"),
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[5][1]["content_block"] == {
        "type": "tool_use",
        "id": "c1",
        "name": "a",
        "input": {},
    }
    end = events[-2][1]
    assert end["delta"]["stop_reason"] == "refusal"
    # The whole usage, in Anthropic's convention: input without cache reads and writes.
    assert end["usage"] == {
        "input_tokens": 10,
        "cache_creation_input_tokens": 4,
        "cache_read_input_tokens": 6,
        "output_tokens": 9,
    }
    # Billed: all input, the cache reads and writes within it, as reported.
    assert renderer.usage() == {
        "input_tokens": 20,
        "output_tokens": 9,
        "cached_input_tokens": 6,
        "cache_write_tokens": 4,
    }


def _native(*events: dict) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-upstream",
        "content": [],
        "usage": {"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 1},
    },
}
TEXT = [
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi "}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "é!"}},
    {"type": "content_block_stop", "index": 0},
]
END = [
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
    {"type": "message_stop"},
]


@pytest.mark.parametrize("cuts", [[], [1], [40, 41, 200], list(range(1, 900, 7))])
def test_an_anthropic_stream_passes_byte_for_byte_but_the_model_whatever_its_reads(cuts):
    raw = _native(START, *TEXT, *END)
    renderer = MessagesPassThrough("sonnet", PROMPT, Delivered(1000))
    out = relay(NativeMessagesEvents("p"), renderer, split(raw, cuts))
    assert out == raw.replace(b'"model":"claude-upstream"', b'"model":"sonnet"')
    assert renderer.usage() == {
        "input_tokens": 7,
        "output_tokens": 3,
        "cached_input_tokens": 2,
        "cache_write_tokens": 0,
    }
    assert renderer.delivered.size == len("Hi é!".encode())


def test_a_broken_count_is_shown_as_billed_and_the_rest_passes():
    start = json.loads(json.dumps(START))
    start["message"]["usage"]["input_tokens"] = -4
    end = [{**END[0], "usage": {"output_tokens": "3"}}, END[1]]
    renderer = MessagesPassThrough("sonnet", PROMPT, Delivered(1000))
    out = relay(NativeMessagesEvents("p"), renderer, [_native(start, *TEXT, *end)])
    events = [orjson.loads(data) for _, data in read_sse(out)]
    shown_start, shown_end = events[0]["message"]["usage"], events[-2]["usage"]
    billed_input = estimate_tokens(PROMPT.text)
    assert shown_start["input_tokens"] + shown_start["cache_read_input_tokens"] == billed_input
    assert shown_end["output_tokens"] == estimate_tokens("Hi é!")
    assert events[0]["message"]["model"] == "sonnet"
    assert orjson.loads(read_sse(out)[2][1]) == TEXT[1]  # the others as they came
