"""Arbitrary credentials, content types and bodies against the real server: whatever is
sent, the answer is a success or one of the spec's errors with its status, never a 500.
Bodies are arbitrary at the top, and well-formed requests of both inference endpoints
with wrong types put deep inside them (tool schemas, tool calls, content parts, ...)."""

import json

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.inference.request_strategies import (
    chat_body,
    json_any,
    responses_body,
    with_wrong_types,
)
from tests.support.errors import REQUEST_ERRORS, SPEC_ERRORS, assert_error
from tests.support.strategies import mostly


@pytest.fixture(scope="module")
def fuzz_keys(gateway):
    project = gateway.create_project("fuzz", "--balance", "1")
    archived = gateway.create_project("fuzz-archived")
    keys = {
        "good": gateway.create_key(project, "inference,receipts"),
        "agents": gateway.create_key(project, "agents"),
        "archived": gateway.create_key(archived, "inference"),
    }
    gateway.cli("projects", "archive", archived)
    return keys


# Header values a client library will send: visible ASCII, obs-text, inner spaces.
header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=60,
).map(str.strip)
key_ref = st.sampled_from(["{good}", "{agents}", "{archived}"])
credential = mostly(
    st.tuples(st.sampled_from(["Bearer ", "bearer ", "BEARER "]), key_ref).map("".join),
    st.one_of(
        header_text,
        key_ref,
        st.tuples(
            st.sampled_from(["Bearer ", "Basic ", "Bearer  ", ""]), st.one_of(key_ref, header_text)
        ).map("".join),
    ),
    60,
)
plausible = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["echo-1", "echo-notools", "echo-off", "x"]),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=20)}),
            min_size=1,
            max_size=2,
        ),
        "input": st.one_of(
            st.text(max_size=20),
            st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "assistant", "system", "?"])},
                    optional={
                        "type": st.sampled_from(["message", "function_call", "reasoning"]),
                        "content": st.one_of(
                            st.text(max_size=10),
                            st.lists(
                                st.fixed_dictionaries(
                                    {
                                        "type": st.sampled_from(
                                            ["input_text", "output_text", "refusal", "x"]
                                        )
                                    },
                                    optional={"text": json_any},
                                ),
                                max_size=2,
                            ),
                            json_any,
                        ),
                    },
                ),
                max_size=2,
            ),
        ),
    },
    optional={
        "tools": st.lists(
            st.fixed_dictionaries({"type": st.just("function"), "name": st.just("f")}), max_size=1
        ),
        "max_tokens": st.integers(-2, 50),
    },
)
request = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.sampled_from(["echo-1", "echo-notools", "echo-off", "x"]), json_any),
        "messages": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "tool", "?"]), "content": json_any}
                ),
                max_size=2,
            ),
            json_any,
        ),
        "input": json_any,
        "tools": json_any,
        "max_tokens": json_any,
        "stream": st.booleans(),
    },
)
bodies = mostly(
    mostly(plausible, request, 60).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=100),
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    route=st.sampled_from(
        [
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/responses"),
            ("GET", "/v1/models"),
            ("GET", "/v1/receipts/rcpt_x"),
            ("GET", "/v1"),
        ]
    ),
    authorization=mostly(credential, st.none(), 70),
    api_key=st.one_of(st.none(), credential),
    content_type=mostly(st.just("application/json"), st.one_of(st.none(), header_text)),
    body=bodies,
)
def test_the_real_server_answers_arbitrary_requests_with_spec_errors(
    http, fuzz_keys, route, authorization, api_key, content_type, body
):
    def fill(value: str) -> str:
        for name, key in fuzz_keys.items():
            value = value.replace("{" + name + "}", key)
        return value

    method, path = route
    headers = {}
    if authorization is not None:
        headers["authorization"] = fill(authorization)
    if api_key is not None:
        headers["x-api-key"] = fill(api_key)
    if content_type is not None:
        headers["content-type"] = content_type
    encoded = {k: v.encode("latin-1") for k, v in headers.items()}
    try:
        response = http.request(
            method, path, headers=encoded, content=body if method == "POST" else None
        )
    except httpx.LocalProtocolError:
        event("refused by the client")
        return  # nothing reached the server
    kind = response.json()["error"]["type"] if response.status_code >= 300 else ""
    event(f"{response.status_code} {kind}")
    if response.status_code < 300:
        assert response.status_code == 200
        assert response.headers["x-request-id"].startswith("req_")
        return
    assert kind in REQUEST_ERRORS, response.text
    assert_error(response, SPEC_ERRORS[kind], kind)


def assert_never_a_failure_of_ours(response: httpx.Response) -> str:
    """A success (streams included: no in-band internal error), or a spec request error."""
    if response.status_code < 300:
        assert response.status_code == 200
        assert b'"internal_error"' not in response.content, response.text
        return "200"
    kind = response.json()["error"]["type"]
    assert kind in REQUEST_ERRORS, response.text
    assert_error(response, SPEC_ERRORS[kind], kind)
    return f"{response.status_code} {kind} {response.json()['error'].get('param')}"


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    request=st.one_of(
        st.tuples(st.just("/v1/chat/completions"), with_wrong_types(chat_body)),
        st.tuples(st.just("/v1/responses"), with_wrong_types(responses_body)),
        # Either endpoint's shape sent to the other: wrong types at every level at once.
        st.tuples(st.just("/v1/chat/completions"), with_wrong_types(responses_body)),
        st.tuples(st.just("/v1/responses"), with_wrong_types(chat_body)),
    )
)
def test_wrong_types_deep_inside_a_request_are_400_never_500(http, fuzz_keys, request):
    path, body = request
    response = http.post(
        path,
        content=json.dumps(body).encode(),
        headers={
            "authorization": f"Bearer {fuzz_keys['good']}",
            "content-type": "application/json",
        },
    )
    event(f"{path} {assert_never_a_failure_of_ours(response).split(' param')[0]}")
