"""Every bad /v1/messages (and count_tokens) request is 400 invalid_request with the
`param` that names the fault in the request's own terms, before anything is held, sent
upstream or billed: no receipt, the books untouched."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.metering.billing import books
from tests.support.errors import assert_error

MARKER = "marker-refused-3c9a"
USER = {"role": "user", "content": MARKER}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
DOCUMENT = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


def _with(**fields) -> dict:
    body = {"model": "an/normal", "max_tokens": 64, "messages": [USER]}
    return {key: value for key, value in {**body, **fields}.items() if value is not None}


def _turns(*content) -> list[dict]:
    """A conversation whose last user turn holds these blocks."""
    return [
        USER,
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": list(content)},
    ]


CASES = {
    "no max_tokens": (_with(max_tokens=None), "max_tokens"),
    "max_tokens 0": (_with(max_tokens=0), "max_tokens"),
    "max_tokens text": (_with(max_tokens="64"), "max_tokens"),
    "no model": (_with(model=None), "model"),
    "no messages": (_with(messages=None), "messages"),
    "empty messages": (_with(messages=[]), "messages"),
    "system role": (_with(messages=[{"role": "system", "content": "x"}]), "messages.0.role"),
    "content a number": (_with(messages=[{"role": "user", "content": 5}]), "messages.0.content"),
    "image block": (
        _with(messages=_turns({"type": "text", "text": "a"}, IMAGE)),
        "messages.2.content.1",
    ),
    "document block": (_with(messages=_turns(DOCUMENT)), "messages.2.content.0"),
    "image in a tool result": (
        _with(
            messages=_turns(
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "a"}, IMAGE],
                }
            )
        ),
        "messages.2.content.0.content.1",
    ),
    "block without a type": (_with(messages=_turns({"text": "a"})), "messages.2.content.0.type"),
    "text not a string": (
        _with(messages=_turns({"type": "text", "text": 5})),
        "messages.2.content.0.text",
    ),
    "tool_use without id": (
        _with(
            messages=[
                USER,
                {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]},
            ]
        ),
        "messages.1.content.0.id",
    ),
    "tool_use input not an object": (
        _with(
            messages=[
                USER,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}],
                },
            ]
        ),
        "messages.1.content.0.input",
    ),
    "tool_result without its id": (
        _with(messages=_turns({"type": "tool_result", "content": "x"})),
        "messages.2.content.0.tool_use_id",
    ),
    "system a number": (_with(system=5), "system"),
    "system text not a string": (_with(system=[{"type": "text", "text": None}]), "system.0.text"),
    "image in system": (_with(system=[IMAGE]), "system.0"),
    "tool without input_schema": (_with(tools=[{"name": "f"}]), "tools.0.input_schema"),
    "tool with an empty name": (_with(tools=[{**TOOL, "name": ""}]), "tools.0.name"),
    "a server tool": (
        _with(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        "tools.0.type",
    ),
    "tool_choice unknown": (_with(tools=[TOOL], tool_choice={"type": "some"}), "tool_choice.type"),
    "tool_choice tool without name": (
        _with(tools=[TOOL], tool_choice={"type": "tool"}),
        "tool_choice",
    ),
    "temperature above 1": (_with(temperature=1.5), "temperature"),
    "top_p above 1": (_with(top_p=2), "top_p"),
    "top_k negative": (_with(top_k=-1), "top_k"),
    "stop_sequences a string": (_with(stop_sequences="STOP"), "stop_sequences"),
    "metadata user_id a number": (_with(metadata={"user_id": 5}), "metadata.user_id"),
    "stream not a boolean": (_with(stream="yes"), "stream"),
    "tools to a model without tools": (_with(model="echo-notools", tools=[TOOL]), "tools"),
}

COUNT_CASES = {
    "no messages": ({"model": "an/normal"}, "messages"),
    "image block": (
        {"model": "an/normal", "messages": [{"role": "user", "content": [IMAGE]}]},
        "messages.0.content.0",
    ),
    "a server tool": (
        {
            "model": "an/normal",
            "messages": [USER],
            "tools": [{"type": "bash_20250124", "name": "b"}],
        },
        "tools.0.type",
    ),
}


@pytest.fixture(scope="module")
def account(gw) -> tuple[str, str]:
    project = gw.create_project("messages-refused", "--balance", "10")
    return project, gw.create_key(project, "inference,receipts")


@pytest.fixture(scope="module")
def refused(gw, account):
    with httpx.Client(base_url=gw.url, headers={"x-api-key": account[1]}, timeout=20) as client:
        yield client


@pytest.mark.parametrize(
    ("path", "case"),
    [("/v1/messages", case) for case in CASES]
    + [("/v1/messages/count_tokens", case) for case in COUNT_CASES],
)
def test_a_bad_request_is_400_with_its_param_and_leaves_no_trace(
    gw, account, refused, fake_anthropic, path, case
):
    body, param = (CASES if path == "/v1/messages" else COUNT_CASES)[case]
    before = books(gw, account[0])
    response = refused.post(
        path, content=orjson.dumps(body), headers={"content-type": "application/json"}
    )
    assert_error(response, 400, "invalid_request", param=param)
    assert "x-receipt-id" not in response.headers
    assert books(gw, account[0]) == before
    assert fake_anthropic.sent(marker=MARKER) == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_the_same_request_well_formed_is_answered(refused, stream):
    """The cases above fail for their one fault: the base request is good."""
    fine = {"role": "user", "content": "Fine."}
    response = refused.post("/v1/messages", json={**_with(messages=[fine]), "stream": stream})
    assert response.status_code == 200, response.text
