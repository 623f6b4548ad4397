"""A host that wraps its own app in the chain's stages, or mounts the whole pipeline, keeps
its websockets and its lifespan: every stage passes a scope that is not a request
(websocket, lifespan) to its inner app untouched, as Starlette's middleware do; the
terminal stages answer such a scope as Starlette's router does (a websocket closed, a
lifespan run). An HTTP request is never let past key auth unauthenticated: one that did
not come through the request id stage fails closed."""

from __future__ import annotations

import contextlib

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from model_gateway.pipeline import build_pipeline, chain, keyed_stages
from model_gateway.pipeline.endpoint import RouteTable
from model_gateway.pipeline.gcra import Gcra
from model_gateway.pipeline.key_auth import KeyAuth
from model_gateway.pipeline.memory import MemoryKeys, MemoryMeter, StaticCatalog
from model_gateway.pipeline.request_id import RequestId
from tests.support.errors import assert_error

PORTS = {"catalog": StaticCatalog({}), "limiter": Gcra(), "meter": MemoryMeter({}, {})}


def host_app(events: list[str], *, request_ids: bool = True, wrapped: bool = True):
    async def echo(websocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    async def plain(request) -> PlainTextResponse:
        return PlainTextResponse("the host's own page")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        events.append("started")
        yield
        events.append("stopped")

    mounted = build_pipeline(
        routes=RouteTable([]),
        keys=MemoryKeys({}, {}),
        cors_origins=[],
        default_key_rpm=1,
        default_project_rpm=1,
        **PORTS,
    )
    inner = Starlette(
        routes=[WebSocketRoute("/ws", echo), Route("/plain", plain), Mount("/api", app=mounted)],
        lifespan=lifespan,
    )
    if not wrapped:
        return inner
    # The host's whole app behind the keyed stages: its requests need a key, its websockets
    # and lifespan pass.
    stages = keyed_stages(
        authenticate=Middleware(KeyAuth, keys=MemoryKeys({}, {})),
        default_key_rpm=1,
        default_project_rpm=1,
        **PORTS,
    )
    return chain([Middleware(RequestId)] * request_ids + stages, inner)


def test_the_hosts_lifespan_and_websocket_pass_every_stage_untouched():
    events: list[str] = []
    with TestClient(host_app(events)) as client:
        assert events == ["started"]
        with client.websocket_connect("/ws") as websocket:
            websocket.send_text("ping")
            assert websocket.receive_text() == "ping"
        assert_error(client.get("/plain"), 401, "invalid_api_key")  # a request: key auth
    assert events == ["started", "stopped"]


def test_a_request_without_the_request_id_stage_fails_closed():
    """Without its context key auth cannot record who asked: never let it through."""
    with TestClient(host_app([], request_ids=False), raise_server_exceptions=False) as client:
        assert client.get("/plain").status_code == 500


def test_the_mounted_pipeline_closes_a_websocket_and_still_answers_its_requests():
    with TestClient(host_app([], wrapped=False)) as client:
        with pytest.raises(WebSocketDisconnect) as closed:
            with client.websocket_connect("/api/v1/anything") as websocket:
                websocket.receive_text()
        assert closed.value.code == 1000
        assert_error(client.get("/api/v1/nothing-here"), 404, "not_found")


def test_a_pipeline_served_alone_completes_its_lifespan():
    alone = build_pipeline(
        routes=RouteTable([]),
        keys=MemoryKeys({}, {}),
        cors_origins=[],
        default_key_rpm=1,
        default_project_rpm=1,
        **PORTS,
    )
    with TestClient(alone) as client:  # raises if the lifespan does not complete
        assert_error(client.get("/v1/x"), 404, "not_found")
