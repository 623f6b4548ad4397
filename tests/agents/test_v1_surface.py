"""Over real HTTP, against `gateway serve`: the agents API is not on /v1, the `agents`
scope changes nothing, and echo's run_code call is what the engine relies on."""

from __future__ import annotations

import httpx
import orjson
import pytest

from model_gateway.gateway.agents.run_code import DEFINITION
from tests.support.errors import assert_error
from tests.support.http import bearer

AGENT_PATHS = [
    "/v1/agents",
    "/v1/agents/agt_123",
    "/v1/agents/agt_123/runs",
    "/v1/agents/agt_123/runs/run_1",
    "/v1/agents/agt_123/runs/run_1/events",
    "/v1/agents/agt_123/runs/run_1/cancel",
]


@pytest.fixture(scope="module")
def http(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def agents_key(gateway) -> str:
    project = gateway.create_project("agents-surface", "--balance", "1")
    return gateway.create_key(project, "inference,agents")


@pytest.mark.parametrize("path", AGENT_PATHS)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
@pytest.mark.parametrize("with_key", [True, False])
def test_every_agents_path_is_not_found(http, agents_key, path, method, with_key):
    headers = bearer(agents_key) if with_key else {}
    assert_error(http.request(method, path, headers=headers, json={}), 404, "not_found")


def test_the_endpoint_list_does_not_name_agents(http, agents_key):
    listed = http.get("/v1", headers=bearer(agents_key))
    assert listed.status_code == 200
    assert not [e for e in listed.json()["data"] if "agents" in e["path"]]
    assert "agents" not in {e["scope"] for e in listed.json()["data"]}


def test_an_agents_scoped_key_works_like_any_key(http, gateway):
    project = gateway.create_project("agents-only", "--balance", "1")
    key = gateway.create_key(project, "agents")
    assert http.get("/v1/models", headers=bearer(key)).status_code == 200
    chat = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}]}
    refused = http.post("/v1/chat/completions", headers=bearer(key), json=chat)
    assert_error(refused, 403, "insufficient_scope")


CODE = "Please run\n```python\nprint(6 * 7)\n```\nthanks"


def _chat(http, key, **extra) -> dict:
    body = {"model": "echo-1", "messages": [{"role": "user", "content": CODE}], **extra}
    answer = http.post("/v1/chat/completions", headers=bearer(key), json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]


def test_echo_calls_run_code_for_a_fenced_block_when_offered_the_tool(http, agents_key):
    choice = _chat(http, agents_key, tools=[DEFINITION])
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "run_code"
    assert orjson.loads(call["function"]["arguments"]) == {
        "runtime": "python",
        "code": "print(6 * 7)\n",
    }


def test_echo_without_the_tool_still_echoes(http, agents_key):
    assert _chat(http, agents_key)["message"]["content"] == CODE
    other_tool = {"type": "function", "function": {"name": "lookup"}}
    assert _chat(http, agents_key, tools=[other_tool])["message"]["content"] == CODE
    refused_tool = _chat(http, agents_key, tools=[DEFINITION], tool_choice="none")
    assert refused_tool["message"]["content"] == CODE


def test_echo_reads_a_tool_result_as_the_next_program(http, agents_key):
    asked = {"role": "user", "content": "go"}
    call = {"id": "call_1", "type": "function",
            "function": {"name": "run_code", "arguments": "{}"}}  # fmt: skip
    messages = [asked, {"role": "assistant", "tool_calls": [call]}]
    plain = [*messages, {"role": "tool", "tool_call_id": "call_1", "content": "42\n"}]
    fenced = [*messages, {"role": "tool", "tool_call_id": "call_1", "content": "```bash\nls\n```"}]
    body = {"model": "echo-1", "tools": [DEFINITION]}
    answer = http.post("/v1/chat/completions", headers=bearer(agents_key),
                       json={**body, "messages": plain}).json()  # fmt: skip
    assert answer["choices"][0]["message"]["content"] == "42\n"
    answer = http.post("/v1/chat/completions", headers=bearer(agents_key),
                       json={**body, "messages": fenced}).json()  # fmt: skip
    [call] = answer["choices"][0]["message"]["tool_calls"]
    assert orjson.loads(call["function"]["arguments"]) == {"runtime": "bash", "code": "ls\n"}
