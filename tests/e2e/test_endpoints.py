"""The spec's general endpoint rules, over real HTTP against `gateway serve`."""

import json
import socket
from decimal import Decimal

import openai
import pytest

from model_gateway.gateway.config import load_config
from tests.support.errors import ERROR_CONTENT_TYPE, assert_error
from tests.support.http import bearer, chat_body

MIB = 1024 * 1024
LIMIT = 2 * MIB


def post(
    http,
    key,
    body: bytes,
    *,
    path="/v1/chat/completions",
    content_type: str | None = "application/json",
    **headers,
):
    if content_type is not None:
        headers["content-type"] = content_type
    return http.post(path, headers={**bearer(key), **headers}, content=body)


def padded_chat(size: int, model: str = "no-such-model") -> bytes:
    """A valid chat request of exactly `size` bytes, for a model that does not exist:
    a 404 model_not_found proves that the body got past the body stage whole."""
    empty = json.dumps(chat_body(model, user="")).encode()
    body = json.dumps(chat_body(model, user="x" * (size - len(empty)))).encode()
    assert len(body) == size
    return body


# -- Content-Type -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "text/json",
        "application/json-seq",
        "multipart/form-data; boundary=x",
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_content_type_other_than_json_is_invalid_request(http, inference_key, content_type, path):
    body = json.dumps(chat_body()).encode()
    response = post(http, inference_key, body, path=path, content_type=content_type)
    assert_error(response, 400, "invalid_request")


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json;charset=UTF-8",
        "APPLICATION/JSON",
    ],
)
def test_json_with_a_charset_parameter_is_accepted(http, inference_key, content_type):
    response = post(http, inference_key, padded_chat(300), content_type=content_type)
    assert_error(response, 404, "model_not_found")


# -- Body size ----------------------------------------------------------------------------


def test_a_body_of_exactly_two_mebibytes_is_accepted(http, inference_key):
    assert_error(post(http, inference_key, padded_chat(LIMIT)), 404, "model_not_found")


def test_a_body_one_byte_over_two_mebibytes_is_invalid_request(http, inference_key):
    response = post(http, inference_key, padded_chat(LIMIT + 1))
    assert_error(response, 400, "invalid_request")


def test_a_chunked_upload_without_content_length_is_limited_too(http, inference_key):
    body = padded_chat(3 * MIB)

    def chunks():
        for i in range(0, len(body), 64 * 1024):
            yield body[i : i + 64 * 1024]

    response = http.post(
        "/v1/chat/completions",
        content=chunks(),
        headers={**bearer(inference_key), "content-type": "application/json"},
    )
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.request.headers
    assert_error(response, 400, "invalid_request")


def test_a_small_chunked_upload_is_accepted(http, inference_key):
    body = padded_chat(5000)
    response = http.post(
        "/v1/chat/completions",
        content=iter([body[:10], body[10:]]),
        headers={**bearer(inference_key), "content-type": "application/json"},
    )
    assert "content-length" not in response.request.headers
    assert_error(response, 404, "model_not_found")


def _read_response(sock) -> tuple[bytes, bytes, bytes]:
    """One HTTP/1.1 response with a Content-Length: (status line, headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed early: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, _, headers = head.partition(b"\r\n")
    fields = dict(line.split(b": ", 1) for line in headers.lower().split(b"\r\n"))
    length = int(fields[b"content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    return status, headers.lower(), body[:length]


def test_a_lying_small_content_length_never_gets_a_big_body_accepted(gateway, inference_key):
    body = padded_chat(3 * MIB, model="echo-1")
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"authorization: Bearer " + inference_key.encode() + b"\r\n"
        b"content-type: application/json\r\ncontent-length: 100\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(head + body[:100])
        status, headers, payload = _read_response(sock)
        # The gateway judged the 100 bytes announced, a truncated JSON document.
        assert status.startswith(b"HTTP/1.1 400"), (status, payload)
        assert b"content-type: " + ERROR_CONTENT_TYPE.encode() in headers
        assert json.loads(payload)["error"]["type"] == "invalid_request"
        # The rest of the 3 MiB is no request at all: it is refused, never run.
        rest = b""
        try:
            sock.sendall(body[100:])
            while chunk := sock.recv(65536):
                rest += chunk
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            pass
    for line in rest.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1"):
            assert line.startswith(b"HTTP/1.1 4"), rest[:300]


# -- Malformed JSON and field validation --------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b'{"model": "echo-1",',
        b"not json",
        b"",
        b"\xff\xfe{}",
        b'{"model": "echo-1", "messages": [}',
    ],
)
def test_malformed_json_is_invalid_request(http, inference_key, body):
    assert_error(post(http, inference_key, body), 400, "invalid_request", param=None)


def test_trailing_garbage_after_the_json_object_is_invalid_request(http, inference_key):
    body = json.dumps(chat_body()).encode() + b" trailing"
    assert_error(post(http, inference_key, body), 400, "invalid_request")


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ("/v1/chat/completions", {"model": "echo-1"}, "messages"),
        (
            "/v1/chat/completions",
            {"model": "echo-1", "messages": [{"role": "user", "content": 42}]},
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            {"model": "echo-1", "messages": [{"role": "user", "content": "a"}, {"content": "b"}]},
            "messages.1.role",
        ),
        ("/v1/chat/completions", {**chat_body(), "temperature": "hot"}, "temperature"),
        ("/v1/responses", {"input": "hi"}, "model"),
        ("/v1/responses", {"model": "echo-1", "input": 42}, "input"),
    ],
)
def test_a_field_failing_validation_names_it_in_param(http, inference_key, path, payload, param):
    response = post(http, inference_key, json.dumps(payload).encode(), path=path)
    assert_error(response, 400, "invalid_request", param=param)


def test_a_chat_image_part_is_invalid_request_pointing_at_the_part(http, inference_key):
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    payload = {"model": "echo-1", "messages": [{"role": "user", "content": content}]}
    response = post(http, inference_key, json.dumps(payload).encode())
    assert_error(response, 400, "invalid_request", param="messages.0.content.1")


def test_a_responses_input_image_is_invalid_request_pointing_at_the_part(http, inference_key):
    content = [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": "https://example.com/cat.png"},
    ]
    payload = {"model": "echo-1", "input": [{"role": "user", "content": content}]}
    response = post(http, inference_key, json.dumps(payload).encode(), path="/v1/responses")
    assert_error(response, 400, "invalid_request", param="input.0.content.1")


TOOLS = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/chat/completions", chat_body("echo-notools", tools=TOOLS)),
        (
            "/v1/responses",
            {
                "model": "echo-notools",
                "input": "hi",
                "tools": [{"type": "function", "name": "now", "parameters": {"type": "object"}}],
            },
        ),
    ],
)
def test_tools_to_a_model_without_tool_support_are_invalid_request(
    http, inference_key, path, payload
):
    response = post(http, inference_key, json.dumps(payload).encode(), path=path)
    assert_error(response, 400, "invalid_request", param="tools")


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/chat/completions", chat_body("echo-off")),
        ("/v1/responses", {"model": "echo-off", "input": "hi"}),
    ],
)
def test_an_unavailable_model_is_service_unavailable(http, inference_key, path, payload):
    response = post(http, inference_key, json.dumps(payload).encode(), path=path)
    assert_error(response, 503, "service_unavailable")


# -- Request ids --------------------------------------------------------------------------


def test_every_response_carries_a_fresh_request_id(http, inference_key):
    responses = [
        http.get("/healthz"),
        http.get("/v1/models", headers=bearer(inference_key)),
        http.get("/v1", headers=bearer(inference_key)),
        http.get("/v1/models"),
        http.get("/v1/nope"),
        http.get("/not-v1"),
        http.post("/v1/models"),
        http.options("/v1/models"),
        http.get("/v1/chat/completions"),
        post(http, inference_key, b"{"),
    ]
    ids = [r.headers["x-request-id"] for r in responses]
    assert all(i.startswith("req_") for i in ids), ids
    assert len(set(ids)) == len(ids)
    for response in responses:
        if response.status_code >= 400:
            assert response.json()["error"]["request_id"] == response.headers["x-request-id"]
            assert response.headers["content-type"] == ERROR_CONTENT_TYPE


# -- Unknown paths and wrong methods ------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/nope",
        "/v1/chat",
        "/v1/completions",
        "/v1/images/generations",
        "/v1/",
    ],
)
@pytest.mark.parametrize("credential", ["none", "invalid", "valid"])
def test_an_unknown_v1_path_is_not_found_whatever_the_credentials(
    http, inference_key, path, credential
):
    headers = {"none": {}, "invalid": bearer("proj_live_nope"), "valid": bearer(inference_key)}[
        credential
    ]
    for response in (
        http.get(path, headers=headers),
        http.post(
            path,
            headers=headers,
            content=b"{",
        ),
    ):
        error = assert_error(response, 404, "not_found")
        assert "GET /v1" in error["message"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", {"POST"}),
        ("GET", "/v1/responses", {"POST"}),
        ("PUT", "/v1/chat/completions", {"POST"}),
        ("POST", "/v1/models", {"GET"}),
        ("POST", "/v1/models/echo-1", {"GET"}),
        ("DELETE", "/v1/models", {"GET"}),
        ("POST", "/v1", {"GET"}),
        ("POST", "/v1/receipts/rcpt_0", {"GET"}),
        ("POST", "/healthz", {"GET"}),
    ],
)
@pytest.mark.parametrize("credential", ["none", "invalid", "valid"])
def test_a_wrong_method_is_405_with_an_allow_header(
    http, inference_key, method, path, allow, credential
):
    headers = {"none": {}, "invalid": {"x-api-key": "junk"}, "valid": bearer(inference_key)}[
        credential
    ]
    response = http.request(method, path, headers=headers)
    assert_error(response, 405, "method_not_allowed")
    assert {m.strip() for m in response.headers["allow"].split(",")} == allow


# -- GET /v1, GET /v1/models, GET /healthz ------------------------------------------------


def test_get_v1_lists_the_endpoints(http, inference_key):
    response = http.get("/v1", headers=bearer(inference_key))
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert all(set(entry) == {"method", "path", "scope"} for entry in body["data"])
    listed = {(e["method"], e["path"]): e["scope"] for e in body["data"]}
    assert listed[("GET", "/v1")] is None
    assert listed[("GET", "/v1/models")] is None
    assert listed[("GET", "/v1/receipts/{receipt_id}")] == "receipts"
    assert listed[("POST", "/v1/chat/completions")] == "inference"
    assert listed[("POST", "/v1/responses")] == "inference"
    assert all(path.startswith("/v1") for _, path in listed)  # healthz is not an API endpoint
    # Every listed endpoint is really there: a wrong method on it is a 405, not a 404.
    for _, path in listed:
        assert http.delete(path.replace("{receipt_id}", "rcpt_0")).status_code == 405


def test_get_v1_needs_a_key(http):
    assert_error(http.get("/v1"), 401, "invalid_api_key")


def test_healthz_needs_no_key(http):
    response = http.get("/healthz")
    assert response.status_code == 200
    health = response.json()
    assert health["status"] == "ok"
    # Detail beside the status: each provider's circuit breaker (test_fallbacks).
    assert all(p["breaker"] == "closed" for p in health["providers"].values())
    assert response.headers["x-request-id"].startswith("req_")


def _expected_models(gateway, allowed):
    config = load_config(gateway.config_path)
    return {mid: m for mid, m in config.models.items() if mid in allowed}


def _check_model_entries(data, expected):
    assert [m["id"] for m in data] == list(expected)
    for entry in data:
        model = expected[entry["id"]]
        assert entry["object"] == "model"
        assert entry["available"] is model.available
        assert entry["supports_tools"] is model.supports_tools
        for field in ("input_price_per_mtok", "output_price_per_mtok"):
            assert isinstance(entry[field], str)  # amounts are decimal strings
            assert Decimal(entry[field]) * 1_000_000 == getattr(model, field)


def test_models_lists_every_model_for_an_unrestricted_key(gateway, http, inference_key):
    response = http.get("/v1/models", headers=bearer(inference_key))
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    expected = _expected_models(gateway, load_config(gateway.config_path).models)
    _check_model_entries(body["data"], expected)
    assert {m["id"]: m["available"] for m in body["data"]}["echo-off"] is False


def test_models_lists_only_what_the_key_and_project_allow(gateway, http):
    project = gateway.create_project(
        "models", "--allow-models", "echo-1,echo-notools,echo-off", "--exclude-models", "echo-off"
    )
    unrestricted = gateway.create_key(project, "agents")
    narrow = gateway.create_key(project, "inference", "--models", "echo-notools,echo-off")
    wide = http.get("/v1/models", headers=bearer(unrestricted)).json()["data"]
    _check_model_entries(wide, _expected_models(gateway, {"echo-1", "echo-notools"}))
    slim = http.get("/v1/models", headers=bearer(narrow)).json()["data"]
    _check_model_entries(slim, _expected_models(gateway, {"echo-notools"}))


def test_models_needs_a_key(http):
    assert_error(http.get("/v1/models"), 401, "invalid_api_key")
    assert_error(http.get("/v1/models/echo-1"), 401, "invalid_api_key")


@pytest.mark.parametrize("model_id", ["echo-1", "org/echo-2", "echo-off"])
def test_a_model_is_retrieved_by_id_even_with_a_slash(gateway, http, inference_key, model_id):
    response = http.get(f"/v1/models/{model_id}", headers=bearer(inference_key))
    assert response.status_code == 200, response.text
    _check_model_entries([response.json()], _expected_models(gateway, {model_id}))


def test_the_sdk_retrieves_a_model(gateway, inference_key):
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=inference_key)
    assert client.models.retrieve("org/echo-2").id == "org/echo-2"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


@pytest.mark.parametrize("model_id", ["nope", "echo-1/extra", "org"])
def test_an_unknown_model_id_is_model_not_found(http, inference_key, model_id):
    response = http.get(f"/v1/models/{model_id}", headers=bearer(inference_key))
    assert_error(response, 404, "model_not_found")


def test_a_model_the_key_may_not_use_is_model_not_found(gateway, http):
    project = gateway.create_project("retrieve", "--exclude-models", "echo-off")
    narrow = gateway.create_key(project, "inference", "--models", "echo-1,echo-off")
    assert http.get("/v1/models/echo-1", headers=bearer(narrow)).status_code == 200
    for excluded in ("echo-off", "echo-notools"):  # by the project, by the key
        assert_error(
            http.get(f"/v1/models/{excluded}", headers=bearer(narrow)), 404, "model_not_found"
        )


# -- Rate limit ---------------------------------------------------------------------------


def test_a_keys_requests_per_minute_are_enforced_with_retry_after(gateway, http, make_key):
    _, key = make_key("inference", "--rpm", "3")
    for _ in range(3):
        assert http.get("/v1/models", headers=bearer(key)).status_code == 200
    refused = http.get("/v1/models", headers=bearer(key))
    error = assert_error(refused, 429, "rate_limit_exceeded")
    assert 1 <= error["retry_after_seconds"] <= 20
    assert refused.headers["retry-after"] == str(error["retry_after_seconds"])


def test_a_projects_requests_per_minute_are_shared_by_its_keys(gateway, http, make_key):
    project, first = make_key("inference", project=("--rpm", "2"))
    second = gateway.create_key(project, "inference")
    assert http.get("/v1/models", headers=bearer(first)).status_code == 200
    assert http.get("/v1/models", headers=bearer(second)).status_code == 200
    assert_error(http.get("/v1/models", headers=bearer(first)), 429, "rate_limit_exceeded")
    assert_error(http.get("/v1/models", headers=bearer(second)), 429, "rate_limit_exceeded")
