import re

from model_gateway.pipeline.context import context_of
from model_gateway.pipeline.errors import ModelNotFound, send_error
from model_gateway.pipeline.request_id import RequestId
from tests.support.asgi import Recorder, call
from tests.support.errors import assert_error


async def test_a_response_carries_a_req_id_that_the_inner_app_saw():
    inner = Recorder()
    reply = await call(RequestId(inner))
    assert reply.status_code == 200
    request_id = reply.headers["x-request-id"]
    assert re.fullmatch(r"req_[0-9a-f]{24}", request_id)
    assert inner.last.ctx.request_id == request_id


async def test_inner_headers_are_kept_and_the_id_added_once():
    inner = Recorder(headers=[(b"x-inner", b"yes")])
    reply = await call(RequestId(inner))
    assert reply.headers["x-inner"] == "yes"
    assert len(reply.headers.get_list("x-request-id")) == 1


async def test_every_request_gets_a_new_id():
    app = RequestId(Recorder())
    ids = {(await call(app)).headers["x-request-id"] for _ in range(50)}
    assert len(ids) == 50


async def test_an_error_from_inside_carries_the_same_id_in_header_and_body():
    async def failing(scope, receive, send):
        await send_error(send, ModelNotFound(), context_of(scope).request_id)

    reply = await call(RequestId(failing))
    assert_error(reply, 404, "model_not_found")


async def test_an_escaping_exception_becomes_a_generic_internal_error():
    async def broken(scope, receive, send):
        raise RuntimeError("sqlite3.OperationalError: /srv/secret/path.db is locked")

    reply = await call(RequestId(broken))
    assert_error(reply, 500, "internal_error", param=None)
    assert b"sqlite" not in reply.content and b"secret" not in reply.content
    assert b"Traceback" not in reply.content


async def test_an_exception_after_the_response_started_sends_no_second_response():
    async def half(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("boom")

    reply = await call(RequestId(half))  # `call` asserts a single response start
    assert reply.status_code == 200
    assert reply.content == b"partial"
    assert reply.headers["x-request-id"].startswith("req_")


async def test_non_http_scopes_pass_through_untouched():
    inner = Recorder()
    app = RequestId(inner)
    scope = {"type": "lifespan"}
    await app(scope, None, None)
    assert inner.last.scope is scope
    assert "state" not in scope
