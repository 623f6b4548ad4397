"""Malformed request bodies found to answer 500: each is a 400 invalid_request naming the
field, and nothing reaches the upstream. (The property test in tests/e2e/test_fuzz.py
looks for more of them.)"""

from __future__ import annotations

import json
import uuid

import pytest

from tests.support.errors import assert_error

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MAX_DEPTH = 64  # decisions.md


def _deep_schema_body(model: str, marker: str, levels: int) -> bytes:
    """A Responses request whose tool's `parameters` nest `levels` objects: the body, its
    `tools` and the tool are three levels above them, so the body is `levels + 3` deep."""
    schema: str = '"leaf"'
    for _ in range(levels):
        schema = '{"a":' + schema + "}"
    tool = '{"type":"function","name":"f","parameters":' + schema + "}"
    return f'{{"model":"{model}","input":"{marker}","tools":[{tool}]}}'.encode()


@pytest.fixture
def marker() -> str:
    return "marker-malformed-" + uuid.uuid4().hex[:8]


def _chat_with_call(marker: str, call: dict) -> dict:
    return {
        "model": "oa/normal",
        "messages": [
            {"role": "user", "content": marker},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
    }


CASES = {
    "tool_calls.function as a string": (
        CHAT,
        lambda m: _chat_with_call(m, {"id": "c1", "type": "function", "function": "now"}),
        "messages.1.tool_calls.0.function",
    ),
    "tool_calls.function.arguments as a number": (
        CHAT,
        lambda m: _chat_with_call(
            m, {"id": "c1", "type": "function", "function": {"name": "now", "arguments": 7}}
        ),
        "messages.1.tool_calls.0.function.arguments",
    ),
    "tools.function as a string": (
        CHAT,
        lambda m: {
            "model": "oa/normal",
            "messages": [{"role": "user", "content": m}],
            "tools": [{"type": "function", "function": "now"}],
        },
        "tools.0.function",
    ),
    "text.format as a string": (
        RESPONSES,
        lambda m: {"model": "oa/normal", "input": m, "text": {"format": "json"}},
        "text.format",
    ),
    "text.format.type unknown": (
        RESPONSES,
        lambda m: {"model": "oa-chat/normal", "input": m, "text": {"format": {"type": 3}}},
        "text.format.type",
    ),
    "tools.parameters as a list": (
        RESPONSES,
        lambda m: {
            "model": "oa-chat/normal",
            "input": m,
            "tools": [{"type": "function", "name": "f", "parameters": [1]}],
        },
        "tools.0.parameters",
    ),
    "reasoning as a string": (
        RESPONSES,
        lambda m: {"model": "oa-chat/normal", "input": m, "reasoning": "high"},
        "reasoning",
    ),
    "tool_choice.function as a string": (
        CHAT,
        lambda m: {
            "model": "an/normal",
            "messages": [{"role": "user", "content": m}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": "f"},
        },
        "tool_choice.function",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_wrong_type_inside_a_field_is_400_with_its_path(
    http, fake_openai, fake_anthropic, marker, case
):
    path, build, param = CASES[case]
    response = http.post(path, json=build(marker))
    assert_error(response, 400, "invalid_request", param=param)
    assert not fake_openai.sent(marker=marker) and not fake_anthropic.sent(marker=marker)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (RESPONSES, b'{"model":"oa/normal","input":"caf\xe9 MARK"}', "input"),
        (
            RESPONSES,
            b'{"model":"oa/normal","input":[{"role":"user","content":"\xff MARK"}]}',
            "input.0.content",
        ),
        (
            RESPONSES,
            b'{"model":"oa/normal","input":"MARK","metadata":{"k":"\xc3"}}',
            "metadata.k",
        ),
        (
            CHAT,
            b'{"model":"oa/normal","messages":[{"role":"user","content":"\xfe MARK"}]}',
            "messages.0.content",
        ),
    ],
    ids=["input", "input item content", "metadata value", "chat content"],
)
def test_invalid_utf8_is_400_with_its_path(http, fake_openai, marker, path, body, param):
    body = body.replace(b"MARK", marker.encode())
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    assert_error(response, 400, "invalid_request", param=param)
    assert not fake_openai.sent(marker=marker)


@pytest.mark.parametrize("levels", [MAX_DEPTH - 2, 5000], ids=["65 levels", "thousands"])
@pytest.mark.parametrize("model", ["oa/normal", "oa-chat/normal", "an/normal"])
def test_a_tool_schema_nested_too_deep_is_400(
    http, fake_openai, fake_anthropic, marker, model, levels
):
    body = _deep_schema_body(model, marker, levels)
    response = http.post(RESPONSES, content=body, headers={"content-type": "application/json"})
    error = assert_error(response, 400, "invalid_request")
    assert error["param"].startswith("tools.0.parameters.a.a")
    assert not fake_openai.sent(marker=marker) and not fake_anthropic.sent(marker=marker)


def test_a_body_nested_64_levels_is_served(http, fake_openai, marker):
    body = _deep_schema_body("oa/normal", marker, MAX_DEPTH - 3)
    assert json.loads(body)  # 64 levels of objects and arrays, the most there may be
    response = http.post(RESPONSES, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert fake_openai.sent(marker=marker)


def test_chat_tool_schema_nested_thousands_deep_is_400(http, marker):
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    body = json.dumps(
        {"model": "oa/normal", "messages": [{"role": "user", "content": marker}], "tools": [tool]}
    ).replace('"parameters": {}', '"parameters": ' + '{"a":' * 3000 + "1" + "}" * 3000)
    response = http.post(CHAT, content=body, headers={"content-type": "application/json"})
    error = assert_error(response, 400, "invalid_request")
    assert error["param"].startswith("tools.0.function.parameters")


BEYOND_64_BITS = [-(2**63) - 1, 2**64]


@pytest.mark.parametrize("number", BEYOND_64_BITS, ids=["below -2^63", "2^64"])
@pytest.mark.parametrize(
    ("path", "build", "param"),
    [
        (
            RESPONSES,
            lambda m, n: {
                "model": "oa/normal",
                "input": m,
                "stream": True,
                "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": n}}},
            },
            "text.format.schema.type",
        ),
        (
            CHAT,
            lambda m, n: {
                "model": "oa/normal",
                "messages": [{"role": "user", "content": m}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"x": n}}}],
            },
            "tools.0.function.parameters.x",
        ),
    ],
    ids=["responses text schema", "chat tool parameters"],
)
def test_an_integer_beyond_64_bits_is_400_with_its_path(
    http, fake_openai, marker, number, path, build, param
):
    """Found by the fuzz test: such an integer cannot be written back (upstream, or in the
    Responses object that repeats the request's `text`), which answered 500."""
    response = http.post(path, json=build(marker, number))
    assert_error(response, 400, "invalid_request", param=param)
    assert not fake_openai.sent(marker=marker)


def test_the_widest_64_bit_integers_and_long_digit_strings_are_served(http, fake_openai, marker):
    body = {
        "model": "oa/normal",
        "input": f"{marker} 123456789012345678901234567890",
        "metadata": {"digits": "98765432109876543210987"},
        "tools": [
            {"type": "function", "name": "f", "parameters": {"lo": -(2**63), "hi": 2**64 - 1}},
            {
                "type": "function",
                "name": "g",
                "parameters": {"x": 1.5e300, "y": 12345678901234567890.5},
            },
        ],
    }
    response = http.post(RESPONSES, json=body)
    assert response.status_code == 200, response.text
    assert fake_openai.sent(marker=marker)
