"""Assertions on the spec's error object, for in-process replies and real HTTP responses alike."""

from __future__ import annotations

import orjson

ERROR_CONTENT_TYPE = "application/json; charset=utf-8"

# The spec's error table: type -> HTTP status.
SPEC_ERRORS = {
    "invalid_request": 400,
    "invalid_api_key": 401,
    "unauthenticated": 401,
    "budget_exceeded": 402,
    "insufficient_balance": 402,
    "forbidden": 403,
    "insufficient_scope": 403,
    "model_not_allowed": 403,
    "model_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "rate_limit_exceeded": 429,
    "internal_error": 500,
    "provider_error": 502,
    "sandbox_error": 502,
    "service_unavailable": 503,
    "provider_timeout": 504,
}

_UNSET = object()


def assert_error(response, status: int, type_: str, *, param=_UNSET) -> dict:
    """Check every rule of an error response and return its `error` object.

    `response` is an httpx.Response or a tests.support.asgi.Reply. `param=None` asserts
    that no param is present; leaving it out does not check it.
    """
    assert SPEC_ERRORS[type_] == status, f"{type_} is not a {status} in the spec"
    body = response.content
    assert response.status_code == status, (response.status_code, body[:500])
    assert response.headers["content-type"] == ERROR_CONTENT_TYPE
    payload = orjson.loads(body)
    assert list(payload) == ["error"], payload
    error = payload["error"]
    assert error["type"] == type_, error
    assert isinstance(error["message"], str) and error["message"]
    request_id = response.headers["x-request-id"]
    assert request_id.startswith("req_"), request_id
    assert error["request_id"] == request_id
    if param is not _UNSET:
        if param is None:
            assert "param" not in error, error
        else:
            assert error.get("param") == param, error
    allowed = {"type", "message", "request_id", "param", "retry_after_seconds"}
    assert set(error) <= allowed, error
    if "retry_after_seconds" in error:
        assert response.headers["retry-after"] == str(error["retry_after_seconds"])
    return error


def without_request_id(response) -> bytes:
    """The raw body with its request id blanked, to compare two error bodies byte for byte."""
    request_id = response.headers["x-request-id"].encode()
    assert response.content.count(request_id) == 1
    return response.content.replace(request_id, b"req_X")


# What the stages up to the rate limit may answer; anything else (500 above all) is a bug.
STAGE_ERRORS = frozenset(
    {
        "invalid_request",
        "invalid_api_key",
        "forbidden",
        "insufficient_scope",
        "model_not_allowed",
        "model_not_found",
        "not_found",
        "method_not_allowed",
        "rate_limit_exceeded",
        "service_unavailable",
    }
)
# And what a request may earn up to dispatch, money included.
REQUEST_ERRORS = STAGE_ERRORS | {"budget_exceeded", "insufficient_balance"}
