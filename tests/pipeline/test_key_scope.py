import pytest

from model_gateway.gateway.access import keys
from model_gateway.pipeline.endpoint import ANY_VALID_KEY, Endpoint
from model_gateway.pipeline.key_scope import KeyScope
from model_gateway.pipeline.request_id import RequestId
from model_gateway.storage.base import KeyRecord, ProjectRecord
from tests.support.asgi import Recorder, WithContext, call
from tests.support.errors import assert_error


async def _handler(ctx):
    raise AssertionError("not called")


CHAT = Endpoint("POST", "/v1/chat/completions", "inference", _handler)
RESPONSES = Endpoint("POST", "/v1/responses", "inference", _handler)
SANDBOX = Endpoint("POST", "/v1/sandbox/executions", "sandboxes", _handler)
RECEIPT = Endpoint("GET", "/v1/receipts/{receipt_id}", "receipts", _handler)
MODELS = Endpoint("GET", "/v1/models", ANY_VALID_KEY, _handler)
PROJECT = ProjectRecord(id="prj_1", name="p")


def key_with(scopes: str) -> KeyRecord:
    return KeyRecord(
        id="key_1",
        prefix="proj_live_abcdefgh",
        key_hash=b"h",
        project_id="prj_1",
        scopes=keys.parse_scopes(scopes),
    )


def build(endpoint, key):
    inner = Recorder()
    app = RequestId(WithContext(KeyScope(inner), endpoint=endpoint, key=key, project=PROJECT))
    return app, inner


@pytest.mark.parametrize(
    ("endpoint", "scopes"),
    [
        (CHAT, "inference"),
        (RESPONSES, "inference,receipts"),
        (SANDBOX, "sandboxes"),
        (RECEIPT, "receipts"),
        (CHAT, "inference,sandboxes,receipts,agents"),
    ],
)
async def test_a_key_with_the_endpoints_scope_passes(endpoint, scopes):
    app, inner = build(endpoint, key_with(scopes))
    reply = await call(app)
    assert reply.status_code == 200
    assert inner.called


@pytest.mark.parametrize(
    ("endpoint", "scopes"),
    [
        (CHAT, "sandboxes"),
        (RESPONSES, "receipts"),
        (SANDBOX, "inference,receipts"),
        (RECEIPT, "inference,sandboxes"),
    ],
)
async def test_a_key_without_the_endpoints_scope_is_insufficient_scope(endpoint, scopes):
    app, inner = build(endpoint, key_with(scopes))
    reply = await call(app)
    error = assert_error(reply, 403, "insufficient_scope", param=None)
    assert endpoint.scope in error["message"]
    assert not inner.called


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES, SANDBOX, RECEIPT])
async def test_the_agents_scope_grants_nothing(endpoint):
    app, inner = build(endpoint, key_with("agents"))
    assert_error(await call(app), 403, "insufficient_scope")
    assert not inner.called


@pytest.mark.parametrize("scopes", ["agents", "receipts", "inference"])
async def test_any_valid_key_endpoints_need_no_particular_scope(scopes):
    app, inner = build(MODELS, key_with(scopes))
    assert (await call(app)).status_code == 200
    assert inner.called


async def test_a_console_session_without_a_key_acts_with_full_project_scope():
    app, inner = build(SANDBOX, None)
    assert (await call(app)).status_code == 200
    assert inner.called
