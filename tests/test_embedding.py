"""`gateway.app.create_app(config)` mounted under /llm in a host Starlette app, on uvicorn."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from model_gateway.gateway.app import create_app
from model_gateway.gateway.config import load_config
from tests.console.support import PASSWORD, create_user
from tests.support.errors import assert_error
from tests.support.gateway_process import GatewayProcess, free_port
from tests.support.http import bearer, chat_body


@pytest.fixture
def deployment(tmp_path):
    """A config and database with a key, made by the CLI; no gateway server is started."""
    process = GatewayProcess(tmp_path)
    project = process.create_project("host", "--balance", "1")
    process.key = process.create_key(project, "inference")
    return process


async def host_home(request):
    return PlainTextResponse("the host app")


@contextlib.asynccontextmanager
async def host_serving(deployment):
    """The host app, with the gateway mounted under /llm, on uvicorn: a client of it."""
    app = create_app(load_config(deployment.config_path))
    host = Starlette(routes=[Route("/", host_home), Mount("/llm", app=app)], lifespan=app.lifespan)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(host, host="127.0.0.1", port=port, lifespan="on", log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(200):
            if server.started or serving.done():
                break
            await asyncio.sleep(0.025)
        assert server.started, "uvicorn did not start"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            yield http
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 15)


async def test_the_gateway_mounted_under_llm_in_a_host_app(deployment):
    async with host_serving(deployment) as http:
        models = await http.get("/llm/v1/models", headers=bearer(deployment.key))
        assert models.status_code == 200
        assert models.headers["x-request-id"].startswith("req_")
        ids = [m["id"] for m in models.json()["data"]]
        assert ids == list(load_config(deployment.config_path).models)

        nope = await http.get("/llm/v1/nope", headers=bearer(deployment.key))
        error = assert_error(nope, 404, "not_found")
        assert "GET /v1" in error["message"]

        assert_error(await http.get("/llm/v1/models"), 401, "invalid_api_key")
        wrong = await http.post("/llm/v1/models", headers=bearer(deployment.key))
        assert_error(wrong, 405, "method_not_allowed")
        assert wrong.headers["allow"] == "GET"
        assert (await http.get("/llm/healthz")).json()["status"] == "ok"

        completion = await http.post(
            "/llm/v1/chat/completions", json=chat_body(), headers=bearer(deployment.key)
        )
        assert completion.status_code == 200, completion.text
        assert completion.json()["model"] == "echo-1"

        home = await http.get("/")  # the host's own routes are the host's
        assert home.text == "the host app"
        assert "x-request-id" not in home.headers


async def test_the_console_names_its_paths_under_the_mount_prefix(deployment):
    create_user(deployment, "owner@example.com")
    async with host_serving(deployment) as http:
        away = await http.get("/llm/console/projects")
        assert away.status_code == 303 and away.headers["location"] == "/llm/console/login"

        login = await http.get("/llm/console/login")
        assert login.status_code == 200
        assert int(login.headers["content-length"]) == len(login.content)
        assert '"/llm/console/static/console.js"' in login.text
        assert '"/console' not in login.text  # no path outside the prefix
        script = await http.get("/llm/console/static/console.js")
        assert script.status_code == 200

        signed = await http.post(
            "/llm/console/api/login", json={"email": "owner@example.com", "password": PASSWORD}
        )
        assert signed.status_code == 200, signed.text
        assert "Path=/llm/console;" in signed.headers["set-cookie"] + ";"
        projects = await http.get("/llm/console/projects")  # the cookie is sent back
        assert projects.status_code == 200
        assert 'href="/llm/console/projects/' in projects.text
        assert '"/console' not in projects.text and '"/proofs/' not in projects.text
