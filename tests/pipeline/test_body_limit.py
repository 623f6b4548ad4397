import pytest

from model_gateway.pipeline.body_limit import MAX_BODY_BYTES, BodyLimit
from model_gateway.pipeline.endpoint import ANY_VALID_KEY, Endpoint
from model_gateway.pipeline.request_id import RequestId
from tests.support.asgi import Recorder, WithContext, call
from tests.support.errors import assert_error


async def _handler(ctx):
    raise AssertionError("not called")


WITH_BODY = Endpoint("POST", "/v1/things", "inference", _handler, decode=lambda body: body)
WITHOUT_BODY = Endpoint("GET", "/v1/models", ANY_VALID_KEY, _handler)
JSON = {"content-type": "application/json"}


def build(endpoint=WITH_BODY, max_bytes=MAX_BODY_BYTES):
    inner = Recorder()
    app = RequestId(WithContext(BodyLimit(inner, max_bytes=max_bytes), endpoint=endpoint))
    return app, inner


def test_the_limit_is_two_mebibytes():
    assert MAX_BODY_BYTES == 2 * 1024 * 1024


async def test_a_json_body_is_read_whole_into_the_context():
    app, inner = build()
    reply = await call(app, "POST", "/v1/things", headers=JSON, body=[b'{"a":', b" 1", b"}"])
    assert reply.status_code == 200
    assert inner.last.ctx.body == b'{"a": 1}'


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json; charset=utf-8",
        "application/json;charset=UTF-8",
        "Application/JSON",
        "application/json ; charset=utf-8",
    ],
)
async def test_json_with_parameters_or_any_case_is_accepted(content_type):
    app, inner = build()
    reply = await call(
        app, "POST", "/v1/things", headers={"content-type": content_type}, body=b"{}"
    )
    assert reply.status_code == 200
    assert inner.called


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        "application/jsonx",
        "application/json-patch+json",
        "text/json",
        "json",
    ],
)
async def test_a_content_type_other_than_json_is_invalid_request(content_type):
    app, inner = build()
    headers = {} if content_type is None else {"content-type": content_type}
    reply = await call(app, "POST", "/v1/things", headers=headers, body=b"{}")
    error = assert_error(reply, 400, "invalid_request")
    assert "content-type" in error["message"].lower()
    assert not inner.called


async def test_a_body_of_exactly_the_limit_is_accepted():
    app, inner = build(max_bytes=1000)
    reply = await call(app, "POST", "/v1/things", headers=JSON, body=[b"x" * 600, b"y" * 400])
    assert reply.status_code == 200
    assert len(inner.last.ctx.body) == 1000


async def test_a_body_one_byte_over_the_limit_is_invalid_request():
    app, inner = build(max_bytes=1000)
    reply = await call(app, "POST", "/v1/things", headers=JSON, body=[b"x" * 600, b"y" * 401])
    assert_error(reply, 400, "invalid_request")
    assert not inner.called


async def test_the_real_limit_applies_to_an_actual_body():
    app, inner = build()
    chunk = b"x" * 65536
    body = [chunk] * (MAX_BODY_BYTES // len(chunk)) + [b"!"]
    reply = await call(app, "POST", "/v1/things", headers=JSON, body=body)
    assert_error(reply, 400, "invalid_request")
    assert not inner.called


async def test_an_announced_oversize_body_is_refused_before_reading_it():
    app, inner = build()
    headers = {**JSON, "content-length": str(MAX_BODY_BYTES + 1)}
    reply = await call(app, "POST", "/v1/things", headers=headers, body=b"{}")
    assert_error(reply, 400, "invalid_request")
    assert reply.receive_calls == 0
    assert not inner.called


async def test_a_chunked_upload_without_content_length_is_counted_as_it_streams():
    app, inner = build(max_bytes=1000)
    reply = await call(app, "POST", "/v1/things", headers=JSON, body=[b"x" * 300] * 10)
    assert_error(reply, 400, "invalid_request")
    assert reply.receive_calls == 4  # stopped at the first chunk over the limit
    assert not inner.called


async def test_a_lying_small_content_length_does_not_let_a_big_body_through():
    app, inner = build(max_bytes=1000)
    headers = {**JSON, "content-length": "10"}
    reply = await call(app, "POST", "/v1/things", headers=headers, body=[b"x" * 700] * 2)
    assert_error(reply, 400, "invalid_request")
    assert not inner.called


@pytest.mark.parametrize("length", ["abc", "-5", "1e9", " 12", "0x10", "9" * 5000, "²", "1³"])
async def test_a_nonsense_content_length_is_never_a_500(length):
    app, inner = build(max_bytes=1000)
    headers = {**JSON, "content-length": length}
    reply = await call(app, "POST", "/v1/things", headers=headers, body=b"{}")
    if reply.status_code != 200:
        assert_error(reply, 400, "invalid_request")
    else:
        assert inner.last.ctx.body == b"{}"


async def test_a_client_that_disconnects_mid_body_gets_no_reply_and_reaches_nothing():
    app, inner = build()

    async def receive():
        receive.calls += 1
        if receive.calls == 1:
            return {"type": "http.request", "body": b'{"a":', "more_body": True}
        return {"type": "http.disconnect"}

    receive.calls = 0
    sent = []

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/things",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "query_string": b"",
    }
    await app(scope, receive, send)
    assert sent == []
    assert not inner.called


async def test_an_endpoint_without_a_body_skips_all_body_rules():
    app, inner = build(endpoint=WITHOUT_BODY)
    reply = await call(
        app, "GET", "/v1/models", headers={"content-type": "text/plain"}, body=b"x" * 10
    )
    assert reply.status_code == 200
    assert reply.receive_calls == 0
    assert inner.last.ctx.body == b""


async def test_an_empty_body_is_passed_on_for_the_decoder_to_judge():
    app, inner = build()
    reply = await call(app, "POST", "/v1/things", headers=JSON)
    assert reply.status_code == 200
    assert inner.last.ctx.body == b""
