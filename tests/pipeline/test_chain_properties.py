"""Arbitrary headers and bodies through the chain build_pipeline builds (metering off), over
a real SQLite database: never a 500, always a spec error."""

import json
import secrets

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from model_gateway.gateway.access.keyring import KeyRing
from model_gateway.gateway.catalog import ConfigCatalog
from model_gateway.gateway.config import parse_config
from model_gateway.gateway.inference.schemas import ChatRequest, ResponsesRequest
from model_gateway.pipeline import build_pipeline
from model_gateway.pipeline.endpoint import ANY_VALID_KEY, Endpoint, RouteTable
from model_gateway.pipeline.gcra import Gcra
from model_gateway.pipeline.validation import decoder
from model_gateway.storage import open_storage
from tests.support.asgi import Recorder, call
from tests.support.errors import SPEC_ERRORS, STAGE_ERRORS, assert_error
from tests.support.records import add_key, add_project
from tests.support.strategies import mostly

CONFIG = """
[providers.local]
kind = "echo"
[models."echo-1"]
provider = "local"
supports_tools = true
[models."echo-notools"]
provider = "local"
[models."echo-off"]
provider = "local"
available = false
"""


CHAT, RESPONSES = decoder(ChatRequest), decoder(ResponsesRequest)


def route_table(terminal: Recorder) -> RouteTable:
    async def handler(ctx):
        return terminal  # the recorder answers, and keeps the context it saw

    return RouteTable(
        [
            Endpoint("GET", "/v1/models", ANY_VALID_KEY, handler),
            Endpoint(
                "POST", "/v1/chat/completions", "inference", handler, decode=decoder(ChatRequest)
            ),
            Endpoint(
                "POST", "/v1/responses", "inference", handler, decode=decoder(ResponsesRequest)
            ),
        ]
    )


@pytest.fixture(scope="module")
async def chain(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chain")
    storage = await open_storage(f"sqlite:///{folder}/gateway.db")
    pepper = secrets.token_bytes(32)
    live = await add_project(storage, "live", allow_models=["echo-1", "echo-notools", "echo-off"])
    archived = await add_project(storage, "archived")
    keys = {
        "good": (await add_key(storage, pepper, live.id, "inference"))[0],
        "agents": (await add_key(storage, pepper, live.id, "agents"))[0],
        "narrow": (await add_key(storage, pepper, live.id, "inference", models=["echo-1"]))[0],
        "archived": (await add_key(storage, pepper, archived.id, "inference"))[0],
    }
    revoked, record = await add_key(storage, pepper, live.id, "inference")
    await storage.revoke_key(record.prefix)
    keys["revoked"] = revoked
    await storage.archive_project(archived.id)
    terminal = Recorder()
    app = build_pipeline(
        routes=route_table(terminal),
        keys=KeyRing(storage, pepper),
        catalog=ConfigCatalog(parse_config(CONFIG)),
        limiter=Gcra(),
        meter=None,
        cors_origins=["https://app.example.com"],
        default_key_rpm=10**9,
        default_project_rpm=10**9,
        max_body_bytes=4096,
    )
    yield app, terminal, keys
    await storage.close()


# Header values as a server would pass them: any byte but CR, LF and NUL.
header_bytes = st.binary(max_size=80).map(
    lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b"\x00", b"")
)
key_names = st.sampled_from(["good", "agents", "narrow", "archived", "revoked"])


@st.composite
def credential(draw):
    """(header value, the named key it carries validly in Bearer form or None)."""
    kind = draw(mostly(st.just("key"), st.sampled_from(["junk", "scheme+junk", "almost"]), 60))
    if kind == "junk":
        return draw(header_bytes), None
    if kind == "scheme+junk":
        return b"Bearer " + draw(header_bytes), None
    name = draw(key_names)
    if kind == "almost":
        return draw(
            st.sampled_from([b"Basic ", b"Bearer", b"Token ", b""])
        ) + b"{" + name.encode() + b"}", None
    scheme = draw(st.sampled_from([b"Bearer", b"bearer", b"BEARER", b"bEaReR"]))
    return scheme + b" {" + name.encode() + b"}", name


json_models = st.one_of(
    st.sampled_from(["echo-1", "echo-notools", "echo-off", "gpt-4o"]),
    st.text(max_size=10),
    st.integers(),
    st.none(),
)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "robot"])},
    optional={
        "content": st.one_of(
            st.text(max_size=20),
            json_value,
            st.lists(
                st.fixed_dictionaries(
                    {
                        "type": st.sampled_from(
                            ["text", "image_url", "input_text", "input_image", "image"]
                        )
                    }
                ),
                max_size=3,
            ),
        )
    },
)
request_json = st.fixed_dictionaries(
    {},
    optional={
        "model": json_models,
        "messages": st.one_of(st.lists(message, max_size=3), json_value),
        "input": st.one_of(st.text(max_size=10), st.lists(message, max_size=2), json_value),
        "tools": st.one_of(st.lists(st.just({"type": "function"}), max_size=2), json_value),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none"]), json_value),
        "stream": json_value,
        "temperature": json_value,
    },
)
plausible_json = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["echo-1", "echo-notools", "echo-off", "gpt-4o"]),
        "messages": st.lists(message, min_size=1, max_size=2),
        "input": st.one_of(st.text(max_size=10), st.lists(message, min_size=1, max_size=2)),
    },
    optional={
        "tools": st.lists(st.just({"type": "function"}), max_size=1),
        "tool_choice": st.sampled_from(["auto", "none"]),
    },
)
bodies = mostly(
    mostly(plausible_json, request_json, 60).map(
        lambda v: json.dumps(v).encode()  # big ints, NaN, Infinity: all fair
    ),
    st.one_of(
        st.binary(max_size=200),
        st.integers(min_value=4000, max_value=5000).map(lambda n: b"{" + b" " * n + b"}"),
    ),
)
# Weighted towards requests that get past the body stage, so later stages see traffic too.
content_types = mostly(
    st.sampled_from([b"application/json", b"application/json; charset=utf-8", b"APPLICATION/JSON"]),
    st.one_of(st.none(), st.sampled_from([b"text/plain", b"application/jsonp"]), header_bytes),
)
content_lengths = st.one_of(
    st.none(), st.integers(0, 10**30).map(lambda n: str(n).encode()), header_bytes
)
known_routes = mostly(
    st.sampled_from(
        [("POST", "/v1/chat/completions"), ("POST", "/v1/responses"), ("GET", "/v1/models")]
    ),
    st.sampled_from([("GET", "/v1/chat/completions"), ("OPTIONS", "/v1/models")]),
)
routes = mostly(
    known_routes,
    st.tuples(
        st.sampled_from(["GET", "POST", "PUT"]),
        st.text(alphabet="/v1abcmodels", max_size=20).map(lambda p: "/" + p),
    ),
)


def fill(value: bytes, keys: dict) -> bytes:
    for name, key in keys.items():
        value = value.replace(b"{" + name.encode() + b"}", key.encode())
    return value


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    route=routes,
    authorization=mostly(credential(), st.none(), 70),
    api_key=st.one_of(
        st.none(),
        credential().map(lambda c: c[0]),
        key_names.map(lambda n: b"{" + n.encode() + b"}"),
    ),
    content_type=content_types,
    content_length=content_lengths,
    body=bodies,
    chunked=st.booleans(),
)
async def test_arbitrary_headers_and_bodies_never_give_a_500(
    chain, route, authorization, api_key, content_type, content_length, body, chunked
):
    app, terminal, keys = chain
    method, path = route
    headers = []
    if authorization is not None:
        headers.append((b"authorization", fill(authorization[0], keys)))
    if api_key is not None:
        headers.append((b"x-api-key", fill(api_key, keys)))
    if content_type is not None:
        headers.append((b"content-type", content_type))
    if content_length is not None:
        headers.append((b"content-length", content_length))
    sent = [body[i : i + 97] for i in range(0, len(body), 97)] if chunked and body else body
    before = len(terminal.calls)

    reply = await call(app, method, path, headers=headers, body=sent)

    reached = len(terminal.calls) > before
    event(f"{reply.status_code} {orjson.loads(reply.content).get('error', {}).get('type', '')}")
    if reply.status_code == 200:
        assert reached
        ctx = terminal.last.ctx
        assert ctx.key is not None and ctx.project.state == "active"
        # Only a usable key presented the one way that counts gets through.
        if authorization is not None:
            assert authorization[1] in {"good", "narrow", "agents"}
        else:
            assert api_key is not None and fill(api_key, keys).strip().decode("latin-1") in {
                keys["good"],
                keys["narrow"],
                keys["agents"],
            }
        if ctx.endpoint.decode is not None:
            assert ctx.payload is not None and ctx.model_id is not None
        return
    assert not reached
    payload = orjson.loads(reply.content)
    type_ = payload["error"]["type"]
    assert type_ in STAGE_ERRORS, payload
    assert_error(reply, SPEC_ERRORS[type_], type_)
    if authorization is not None and authorization[1] not in {"good", "narrow", "agents"}:
        assert type_ in {
            "invalid_request",
            "invalid_api_key",
            "forbidden",
            "not_found",
            "method_not_allowed",
        }, payload
