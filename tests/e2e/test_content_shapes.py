"""Free-form content and Responses input items: a wrong type anywhere the gateway reads is
a 400 with its path, never a 500 (found by the fuzz test: a part whose text was `true`)."""

from __future__ import annotations

import pytest

from tests.support.errors import assert_error
from tests.support.http import bearer

CASES = [
    (
        "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": True}]}]},
        "input.0.content.0.text",
    ),
    ("/v1/responses", {"input": [{"role": "user", "content": [None]}]}, "input.0.content.0"),
    ("/v1/responses", {"input": [{"role": "robot", "content": "hi"}]}, "input.0.role"),
    (
        "/v1/responses",
        {"input": [{"type": "function_call", "call_id": "c1", "name": 3}]},
        "input.0.name",
    ),
    (
        "/v1/responses",
        {"input": [{"type": "function_call_output", "call_id": "c1", "output": 7}]},
        "input.0.output",
    ),
    ("/v1/responses", {"input": [{"type": 5, "content": "x"}]}, "input.0.type"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages.0.content.0.text",
    ),
]


@pytest.mark.parametrize(("path", "fields", "param"), CASES, ids=[c[2] for c in CASES])
def test_a_wrongly_typed_field_is_a_400_naming_it(http, inference_key, path, fields, param):
    response = http.post(path, json={"model": "echo-1", **fields}, headers=bearer(inference_key))
    assert assert_error(response, 400, "invalid_request")["param"] == param


def test_well_formed_items_of_every_translated_kind_are_served(http, make_key):
    _, key = make_key("inference", project=("--balance", "1"))
    items = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
        {"role": "user", "content": "thanks"},
    ]
    response = http.post(
        "/v1/responses", json={"model": "echo-1", "input": items}, headers=bearer(key)
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "completed"
