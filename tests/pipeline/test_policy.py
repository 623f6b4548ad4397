import orjson
import pytest

from model_gateway.gateway.access import keys
from model_gateway.gateway.catalog import ConfigCatalog
from model_gateway.gateway.config import parse_config
from model_gateway.gateway.inference.schemas import ChatRequest, ResponsesRequest
from model_gateway.pipeline.endpoint import ANY_VALID_KEY, Endpoint
from model_gateway.pipeline.policy import Policy
from model_gateway.pipeline.request_id import RequestId
from model_gateway.pipeline.validation import decoder
from model_gateway.storage.base import KeyRecord, ProjectRecord
from tests.support.asgi import Recorder, WithContext, call
from tests.support.errors import assert_error

UNSET_ENV = "GATEWAY_TEST_POLICY_NEVER_SET_KEY"

CONFIG = f"""
[providers.local]
kind = "echo"

[providers.remote]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "{UNSET_ENV}"

[models."echo-1"]
provider = "local"
supports_tools = true

[models."echo-notools"]
provider = "local"
supports_tools = false

[models."echo-off"]
provider = "local"
available = false

[models."remote-1"]
provider = "remote"
supports_tools = true
"""


async def _handler(ctx):
    raise AssertionError("not called")


CHAT = Endpoint("POST", "/v1/chat/completions", "inference", _handler, decode=decoder(ChatRequest))
RESPONSES = Endpoint(
    "POST", "/v1/responses", "inference", _handler, decode=decoder(ResponsesRequest)
)
MODELS = Endpoint("GET", "/v1/models", ANY_VALID_KEY, _handler)


@pytest.fixture(scope="module")
def catalog():
    return ConfigCatalog(parse_config(CONFIG))


def key(models=None) -> KeyRecord:
    return KeyRecord(
        id="key_1",
        prefix="proj_live_abcdefgh",
        key_hash=b"h",
        project_id="prj_1",
        scopes=keys.parse_scopes("inference"),
        models=models,
    )


def project(**fields) -> ProjectRecord:
    return ProjectRecord(id="prj_1", name="p", **fields)


async def run(catalog, payload, *, endpoint=CHAT, key_=None, project_=None, raw=None):
    inner = Recorder()
    app = RequestId(
        WithContext(
            Policy(inner, catalog=catalog),
            endpoint=endpoint,
            key=key_ or key(),
            project=project_ or project(),
            body=raw if raw is not None else orjson.dumps(payload),
        )
    )
    return await call(app, "POST", endpoint.path), inner


def chat(model="echo-1", **extra):
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


async def test_a_valid_request_is_decoded_into_the_context(catalog, monkeypatch):
    monkeypatch.delenv(UNSET_ENV, raising=False)
    reply, inner = await run(catalog, chat(temperature=0.5))
    assert reply.status_code == 200
    ctx = inner.last.ctx
    assert isinstance(ctx.payload, ChatRequest)
    assert ctx.payload.messages[0].content == "hi"
    assert ctx.model_id == "echo-1"
    assert ctx.model is catalog.models["echo-1"]


@pytest.mark.parametrize("raw", [b"", b"{", b'{"model": "echo-1",}', b"\xff\xfe", b"nul"])
async def test_malformed_json_is_invalid_request(catalog, raw):
    reply, inner = await run(catalog, None, raw=raw)
    assert_error(reply, 400, "invalid_request")
    assert not inner.called


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "echo-1"}, "messages"),
        ({"model": "", "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": 7, "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "echo-1", "messages": []}, "messages"),
        ({"model": "echo-1", "messages": [{"role": "user", "content": 123}]}, "messages.0.content"),
        (
            {
                "model": "echo-1",
                "messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}],
            },
            "messages.1.role",
        ),
        ({"model": "echo-1", "messages": [{"role": "user"}]}, "messages.0.content"),
        ({**chat(), "temperature": 3}, "temperature"),
        ({**chat(), "stream": "yes"}, "stream"),
    ],
)
async def test_a_field_failing_validation_is_named_in_param(catalog, payload, param):
    reply, inner = await run(catalog, payload)
    assert_error(reply, 400, "invalid_request", param=param)
    assert not inner.called


async def test_a_body_that_is_not_an_object_is_invalid_request(catalog):
    reply, _ = await run(catalog, [chat()])
    assert_error(reply, 400, "invalid_request")


async def test_a_chat_image_part_is_refused_with_its_path(catalog):
    content = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    ]
    payload = {"model": "echo-1", "messages": [{"role": "user", "content": content}]}
    reply, inner = await run(catalog, payload)
    assert_error(reply, 400, "invalid_request", param="messages.0.content.1")
    assert not inner.called


async def test_a_responses_input_image_is_refused_with_its_path(catalog):
    content = [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "https://example.com/a.png"},
    ]
    payload = {"model": "echo-1", "input": [{"role": "user", "content": content}]}
    reply, inner = await run(catalog, payload, endpoint=RESPONSES)
    assert_error(reply, 400, "invalid_request", param="input.0.content.1")
    assert not inner.called


async def test_a_responses_string_input_is_accepted(catalog):
    reply, inner = await run(catalog, {"model": "echo-1", "input": "hi"}, endpoint=RESPONSES)
    assert reply.status_code == 200
    assert isinstance(inner.last.ctx.payload, ResponsesRequest)


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
@pytest.mark.parametrize("extra", [{"tools": TOOLS}, {"tool_choice": "auto"}])
async def test_tools_to_a_model_without_tool_support_are_invalid_request(catalog, endpoint, extra):
    payload = (
        chat("echo-notools", **extra)
        if endpoint is CHAT
        else {"model": "echo-notools", "input": "hi", **extra}
    )
    reply, inner = await run(catalog, payload, endpoint=endpoint)
    assert_error(reply, 400, "invalid_request", param="tools")
    assert not inner.called


async def test_tools_to_a_model_with_tool_support_pass(catalog):
    reply, inner = await run(catalog, chat("echo-1", tools=TOOLS))
    assert reply.status_code == 200
    assert inner.last.ctx.payload.uses_tools


async def test_an_unknown_model_is_model_not_found(catalog):
    reply, inner = await run(catalog, chat("no-such-model"))
    assert_error(reply, 404, "model_not_found")
    assert not inner.called


@pytest.mark.parametrize(
    ("key_models", "project_fields"),
    [
        (["echo-notools"], {}),
        (None, {"allow_models": ["echo-notools"]}),
        (None, {"exclude_models": ["echo-1"]}),
        (["echo-1"], {"allow_models": ["echo-notools"]}),
    ],
)
async def test_a_model_outside_the_key_or_project_policy_is_model_not_allowed(
    catalog, key_models, project_fields
):
    reply, inner = await run(
        catalog, chat("echo-1"), key_=key(key_models), project_=project(**project_fields)
    )
    assert_error(reply, 403, "model_not_allowed")
    assert not inner.called


async def test_a_model_inside_every_policy_passes(catalog):
    reply, _ = await run(
        catalog,
        chat("echo-1"),
        key_=key(["echo-1", "echo-notools"]),
        project_=project(allow_models=["echo-1"], exclude_models=["echo-off"]),
    )
    assert reply.status_code == 200


async def test_an_unavailable_model_is_service_unavailable(catalog):
    reply, inner = await run(catalog, chat("echo-off"))
    assert_error(reply, 503, "service_unavailable")
    assert not inner.called


async def test_a_model_whose_provider_is_not_configured_is_service_unavailable(
    catalog, monkeypatch
):
    monkeypatch.delenv(UNSET_ENV, raising=False)
    reply, inner = await run(catalog, chat("remote-1"))
    assert_error(reply, 503, "service_unavailable")
    assert not inner.called
    monkeypatch.setenv(UNSET_ENV, "sk-test")
    reply, inner = await run(catalog, chat("remote-1"))
    assert reply.status_code == 200


async def test_an_endpoint_without_a_body_is_not_judged(catalog):
    reply, inner = await run(catalog, None, endpoint=MODELS, raw=b"not json")
    assert reply.status_code == 200
    assert inner.last.ctx.payload is None


@pytest.mark.parametrize("part", [None, 1, "text", ["nested"]])
async def test_a_responses_content_part_that_is_not_an_object_is_invalid_request(catalog, part):
    payload = {
        "model": "echo-1",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}, part]}],
    }
    reply, inner = await run(catalog, payload, endpoint=RESPONSES)
    assert_error(reply, 400, "invalid_request", param="input.0.content.1")
    assert not inner.called
