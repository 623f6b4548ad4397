import pytest

from model_gateway.pipeline.endpoint import ANY_VALID_KEY, PUBLIC, Endpoint, RouteTable
from model_gateway.pipeline.request_id import RequestId
from model_gateway.pipeline.routing import Routing
from tests.support.asgi import Recorder, call
from tests.support.errors import assert_error


async def _handler(ctx):
    raise AssertionError("routing never runs a handler")


def _decode(body: bytes):
    return body


ENDPOINTS = [
    Endpoint("GET", "/healthz", PUBLIC, _handler, listed=False),
    Endpoint("GET", "/v1", ANY_VALID_KEY, _handler),
    Endpoint("GET", "/v1/models", ANY_VALID_KEY, _handler),
    Endpoint("POST", "/v1/chat/completions", "inference", _handler, decode=_decode),
    Endpoint("GET", "/v1/receipts/{receipt_id}", "receipts", _handler),
    Endpoint("GET", "/v1/things", ANY_VALID_KEY, _handler),
    Endpoint("POST", "/v1/things", "inference", _handler, decode=_decode),
]


def build():
    inner, public = Recorder(), Recorder(body=b'{"reached":"public"}')
    # RequestId supplies the context (and the x-request-id the error checks compare with).
    app = RequestId(Routing(table=RouteTable(ENDPOINTS), public=public, keyed=inner))
    return app, inner, public


@pytest.mark.parametrize("path", ["/v1/nope", "/v1/models/extra", "/v1/", "/v1/chat", "/v1x"])
async def test_an_unknown_v1_path_is_not_found_and_points_at_get_v1(path):
    app, inner, public = build()
    reply = await call(app, "GET", path)
    error = assert_error(reply, 404, "not_found")
    if path.startswith("/v1/"):
        assert "GET /v1" in error["message"]
    assert not inner.called and not public.called


async def test_an_unknown_path_outside_v1_is_not_found_too():
    app, inner, _ = build()
    reply = await call(app, "GET", "/nothing/here")
    assert_error(reply, 404, "not_found")
    assert not inner.called


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", "/v1", "GET"),
        ("PUT", "/v1/receipts/rcpt_1", "GET"),
        ("POST", "/healthz", "GET"),
    ],
)
async def test_a_wrong_method_is_405_with_an_allow_header(method, path, allow):
    app, inner, public = build()
    reply = await call(app, method, path)
    assert_error(reply, 405, "method_not_allowed")
    assert reply.headers["allow"] == allow
    assert not inner.called and not public.called


async def test_allow_lists_every_method_of_the_path():
    app, _, _ = build()
    reply = await call(app, "PATCH", "/v1/things")
    assert_error(reply, 405, "method_not_allowed")
    assert {m.strip() for m in reply.headers["allow"].split(",")} == {"GET", "POST"}


async def test_a_known_route_reaches_the_inner_app_with_its_endpoint():
    app, inner, public = build()
    reply = await call(app, "POST", "/v1/chat/completions")
    assert reply.status_code == 200
    ctx = inner.last.ctx
    assert (ctx.endpoint.method, ctx.endpoint.path) == ("POST", "/v1/chat/completions")
    assert ctx.path_params == {}
    assert not public.called


async def test_path_parameters_are_extracted():
    app, inner, _ = build()
    await call(app, "GET", "/v1/receipts/rcpt_abc123")
    assert inner.last.ctx.endpoint.path == "/v1/receipts/{receipt_id}"
    assert inner.last.ctx.path_params == {"receipt_id": "rcpt_abc123"}


async def test_a_path_parameter_never_spans_a_slash():
    app, inner, _ = build()
    reply = await call(app, "GET", "/v1/receipts/a/b")
    assert_error(reply, 404, "not_found")
    assert not inner.called


async def test_public_endpoints_skip_the_key_stages():
    app, inner, public = build()
    reply = await call(app, "GET", "/healthz")
    assert reply.json() == {"reached": "public"}
    assert not inner.called
    assert public.last.ctx.endpoint.path == "/healthz"


async def test_the_mount_root_path_is_ignored_when_routing():
    app, inner, _ = build()
    reply = await call(app, "GET", "/llm/v1/models", root_path="/llm")
    assert reply.status_code == 200
    assert inner.last.ctx.endpoint.path == "/v1/models"
    nope = await call(app, "GET", "/llm/v1/nope", root_path="/llm")
    assert_error(nope, 404, "not_found")
    assert len(inner.calls) == 1


async def test_routing_needs_no_credentials_and_reads_no_body():
    app, inner, _ = build()
    reply = await call(app, "POST", "/v1/chat/completions", body=[b"{", b"}"])
    assert reply.status_code == 200
    assert reply.receive_calls == 0
    assert inner.last.ctx.key is None and inner.last.ctx.body == b""
