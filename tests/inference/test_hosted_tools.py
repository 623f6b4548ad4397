"""Only `function` tools pass: a hosted tool (web search, code interpreter, MCP, ...) runs
upstream at a cost no price covers, so it is a 400 naming `tools.N.type`, refused before
anything reaches the upstream."""

from __future__ import annotations

import uuid

import pytest

from tests.support.errors import assert_error

FUNCTION = {"type": "function", "name": "now", "parameters": {"type": "object"}}
CHAT_FUNCTION = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
HOSTED = [
    {"type": "web_search_preview"},
    {"type": "web_search"},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "image_generation"},
    {"type": "mcp", "server_label": "x", "server_url": "https://attacker.example/mcp"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "computer_use_preview", "display_width": 1, "display_height": 1},
    {"type": "local_shell"},
    {"type": "custom", "name": "grammar"},
    {"name": "untyped"},
]


def _ids(tools: list[dict]) -> list[str]:
    return [tool.get("type", "untyped") for tool in tools]


@pytest.fixture
def marker() -> str:
    return "marker-tools-" + uuid.uuid4().hex[:8]


def _assert_refused_before_upstream(response, param: str, fakes, marker: str) -> None:
    assert_error(response, 400, "invalid_request", param=param)
    assert "x-receipt-id" not in response.headers
    assert all(not fake.sent(marker=marker) for fake in fakes)


@pytest.mark.parametrize("model", ["oa/normal", "oa-chat/normal", "an/normal"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("tool", HOSTED, ids=_ids(HOSTED))
def test_responses_refuse_every_tool_but_function(
    http, fake_openai, fake_anthropic, marker, model, stream, tool
):
    request = {"model": model, "input": marker, "stream": stream, "tools": [FUNCTION, tool]}
    response = http.post("/v1/responses", json=request)
    _assert_refused_before_upstream(response, "tools.1.type", (fake_openai, fake_anthropic), marker)


@pytest.mark.parametrize("model", ["oa/normal", "an/normal"])
@pytest.mark.parametrize("tool", HOSTED, ids=_ids(HOSTED))
def test_chat_completions_refuse_every_tool_but_function(
    http, fake_openai, fake_anthropic, marker, model, tool
):
    request = {
        "model": model,
        "messages": [{"role": "user", "content": marker}],
        "tools": [tool, CHAT_FUNCTION],
    }
    response = http.post("/v1/chat/completions", json=request)
    _assert_refused_before_upstream(response, "tools.0.type", (fake_openai, fake_anthropic), marker)


@pytest.mark.parametrize(
    ("path", "choice"),
    [
        ("/v1/responses", {"type": "web_search_preview"}),
        ("/v1/responses", {"type": "mcp", "server_label": "x"}),
        ("/v1/chat/completions", {"type": "allowed_tools", "mode": "auto", "tools": []}),
        ("/v1/chat/completions", {"type": "custom", "custom": {"name": "x"}}),
    ],
)
def test_a_hosted_tool_cannot_be_chosen(http, fake_openai, marker, path, choice):
    if path == "/v1/responses":
        request = {"model": "oa/normal", "input": marker, "tools": [FUNCTION]}
    else:
        request = {
            "model": "oa/normal",
            "messages": [{"role": "user", "content": marker}],
            "tools": [CHAT_FUNCTION],
        }
    response = http.post(path, json=request | {"tool_choice": choice})
    _assert_refused_before_upstream(response, "tool_choice.type", (fake_openai,), marker)


def test_function_tools_still_pass_to_the_upstream(http, fake_openai, marker):
    response = http.post(
        "/v1/responses",
        json={"model": "oa/normal", "input": marker, "tools": [FUNCTION], "tool_choice": "auto"},
    )
    assert response.status_code == 200
    [sent] = fake_openai.sent(marker=marker)
    assert sent.body["tools"] == [FUNCTION]
