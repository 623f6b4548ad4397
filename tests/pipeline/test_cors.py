import pytest

from model_gateway.pipeline.cors import Cors
from tests.support.asgi import Recorder, call

ALLOWED = "https://app.example.com"


def cors_headers(reply) -> dict[str, str]:
    return {k: v for k, v in reply.headers.items() if k.startswith("access-control-")}


def preflight(origin: str, method: str = "POST") -> dict:
    return {
        "origin": origin,
        "access-control-request-method": method,
        "access-control-request-headers": "authorization, content-type",
    }


async def test_preflight_from_an_allowed_origin_is_answered_without_the_inner_app():
    inner = Recorder()
    reply = await call(
        Cors(inner, origins=[ALLOWED]),
        "OPTIONS",
        "/v1/chat/completions",
        headers=preflight(ALLOWED),
    )
    assert not inner.called
    assert reply.status_code in (200, 204)
    assert cors_headers(reply) == {
        "access-control-allow-origin": ALLOWED,
        "access-control-allow-methods": "GET, POST, OPTIONS",
        "access-control-allow-headers": (
            "authorization, content-type, x-api-key, anthropic-version, anthropic-beta"
        ),
        "access-control-max-age": "600",
    }
    assert "access-control-allow-credentials" not in reply.headers
    assert "Origin" in reply.headers.get("vary", "")


async def test_an_actual_request_from_an_allowed_origin_exposes_request_and_receipt_ids():
    inner = Recorder()
    reply = await call(
        Cors(inner, origins=["https://other.example", ALLOWED]),
        "GET",
        "/v1/models",
        headers={"origin": ALLOWED},
    )
    assert inner.called
    assert reply.status_code == 200
    headers = cors_headers(reply)
    assert headers["access-control-allow-origin"] == ALLOWED
    exposed = {h.strip() for h in headers["access-control-expose-headers"].split(",")}
    assert exposed == {"x-request-id", "x-receipt-id"}
    assert "access-control-allow-credentials" not in headers


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example",
        "https://app.example.com.evil.example",
        "http://app.example.com",  # another scheme is another origin
        "https://app.example.com:8443",
        "https://app.example.com/",
        "null",
    ],
)
async def test_other_origins_get_no_cors_headers_at_all(origin):
    inner = Recorder()
    app = Cors(inner, origins=[ALLOWED])
    actual = await call(app, "GET", "/v1/models", headers={"origin": origin})
    assert actual.status_code == 200
    assert cors_headers(actual) == {}
    inner.status = 405
    pre = await call(app, "OPTIONS", "/v1/models", headers=preflight(origin))
    assert len(inner.calls) == 2  # the preflight went on, like any other request
    assert pre.status_code == 405
    assert cors_headers(pre) == {}


async def test_no_configured_origins_means_no_cors_for_anyone():
    inner = Recorder(status=405)
    reply = await call(Cors(inner, origins=[]), "OPTIONS", "/v1/models", headers=preflight(ALLOWED))
    assert inner.called
    assert cors_headers(reply) == {}


async def test_a_request_without_origin_gets_no_cors_headers():
    inner = Recorder()
    reply = await call(Cors(inner, origins=[ALLOWED]), "GET", "/v1/models")
    assert inner.called
    assert cors_headers(reply) == {}


async def test_options_without_a_requested_method_is_not_a_preflight():
    inner = Recorder(status=405)
    reply = await call(
        Cors(inner, origins=[ALLOWED]), "OPTIONS", "/v1/models", headers={"origin": ALLOWED}
    )
    assert inner.called
    assert reply.status_code == 405
    assert reply.headers["access-control-allow-origin"] == ALLOWED


async def test_error_responses_to_an_allowed_origin_carry_cors_headers_too():
    inner = Recorder(status=401, body=b'{"error":{}}')
    reply = await call(
        Cors(inner, origins=[ALLOWED]), "GET", "/v1/models", headers={"origin": ALLOWED}
    )
    assert reply.status_code == 401
    assert reply.headers["access-control-allow-origin"] == ALLOWED
    assert "x-request-id" in reply.headers["access-control-expose-headers"]


async def test_non_http_scopes_pass_through():
    inner = Recorder()
    scope = {"type": "lifespan"}
    await Cors(inner, origins=[ALLOWED])(scope, None, None)
    assert inner.last.scope is scope
