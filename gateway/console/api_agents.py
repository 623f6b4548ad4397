"""Hosted agents and their runs, as the console's JSON API (decisions.md, "Hosted agents").

The engine (`gateway.agents`) does the work and the checking of bodies; this module adds
the console's rules: an agent is as visible as its project (else 404, like a missing one),
and a run is found only under its own agent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import msgspec
from starlette.responses import Response, StreamingResponse

from model_gateway.gateway.agents.agent_views import (
    agent_view,
    decode_agent_request,
    decode_run_request,
    run_view,
)
from model_gateway.gateway.console.call import SESSION, Call, route
from model_gateway.gateway.console.guard import project_of, visible_project
from model_gateway.gateway.console.payload import whole_number
from model_gateway.gateway.console.views import page
from model_gateway.gateway.json_response import json_response
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import Conflict, NotFound
from model_gateway.storage import StateConflict
from model_gateway.storage.base import AgentRecord, RunRecord

if TYPE_CHECKING:
    from model_gateway.gateway.agents.run_engine import AgentEngine
    from model_gateway.gateway.console.mount import Console

_AGENT = "/console/api/agents/{agent_id}"
_RUN = _AGENT + "/runs/{run_id}"
SSE_HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}


async def visible_agent(console: Console, call: Call) -> AgentRecord:
    """The agent named in the path, if the signed-in user may see its project."""
    agent = await console.gateway.agents.get_agent(call.params["agent_id"])
    if agent is None:
        raise NotFound("No agent with this ID exists.")
    await visible_project(console.storage, call.session_user, agent.project_id)
    return agent


async def visible_run(console: Console, call: Call) -> tuple[AgentRecord, RunRecord]:
    """The agent and the run named in the path; a run of another agent is 404."""
    agent = await visible_agent(console, call)
    run = await console.gateway.agents.get_run(call.params["run_id"])
    if run is None or run.agent_id != agent.id:
        raise NotFound("No run with this ID exists.")
    return agent, run


def _after(call: Call) -> int:
    """Where a reconnecting stream resumes: after the step of `Last-Event-ID` (an id this
    stream gave), from the start without one. Read before the stream starts: a bad one is
    a 400, not a stream cut mid-body."""
    last = call.request.headers.get("last-event-id", "")
    if not last:
        return 0
    message = "'Last-Event-ID' is not an event id this stream gave."
    return whole_number(last, "Last-Event-ID", message) + 1


def routes(console: Console) -> list[Endpoint]:
    storage = console.storage

    def engine() -> AgentEngine:
        return console.gateway.agents

    async def list_agents(call: Call) -> Response:
        project = await project_of(storage, call)
        agents = await engine().list_agents(project.id)
        return json_response(page([agent_view(a) for a in agents]))

    async def create_agent(call: Call) -> Response:
        project = await project_of(storage, call)
        request = decode_agent_request(await call.body())
        agent = await engine().create_agent(project.id, **msgspec.structs.asdict(request))
        return json_response(agent_view(agent), status=201)

    async def start_run(call: Call) -> Response:
        agent = await visible_agent(console, call)
        request = decode_run_request(await call.body())
        run = await engine().start_run(agent, input=request.input, budget=request.budget_micros)
        return json_response(run_view(run, []), status=201)

    async def show_run(call: Call) -> Response:
        _, run = await visible_run(console, call)
        return json_response(run_view(run, await engine().run_steps(run.id)))

    async def run_events(call: Call) -> Response:
        _, run = await visible_run(console, call)
        after = _after(call)

        async def stream() -> AsyncIterator[bytes]:
            async for event in engine().events(run.id, after=after):
                yield event.sse()

        return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def cancel_run(call: Call) -> Response:
        _, run = await visible_run(console, call)
        try:
            cancelled = await engine().cancel(run.id)
        except StateConflict:
            raise Conflict("The run has already ended.") from None
        return json_response(run_view(cancelled, await engine().run_steps(run.id)))

    return [
        route("GET", "/console/api/projects/{project_id}/agents", SESSION, list_agents),
        route("POST", "/console/api/projects/{project_id}/agents", SESSION, create_agent),
        route("POST", _AGENT + "/runs", SESSION, start_run),
        route("GET", _RUN, SESSION, show_run),
        route("GET", _RUN + "/events", SESSION, run_events),
        route("POST", _RUN + "/cancel", SESSION, cancel_run),
    ]
