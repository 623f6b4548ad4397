"""The run engine: agents, and runs that go on in the background of this process.

A run loops: model call; if the model asks for `run_code`, one sandbox execution in the
agent's sandbox configuration, its result back to the model as a tool message; until a
final answer (completed) or `max_steps`. Each step is metered as on /v1 (`run_step`) and
admitted against the run's remaining budget by storage, so `spent` never exceeds
`budget` however many runs, steps and instances share a project.

Runs are leased to this process like holds (`owner` is the meter's `host:pid:start`):
a sweeper renews this process's leases, fails the runs of dead owners (an instance whose
registry lease ended included) and expired leases (their holds released by storage), and
notices cancels requested by other instances.
Nothing ends silently: every run ends with a status, and an error object unless it
completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from model_gateway.gateway.agents.run_code import DEFINITION, BadToolCall, parse_call, tool_result
from model_gateway.gateway.agents.run_events import RunEvent, RunFeed
from model_gateway.gateway.agents.run_step import (
    RunStops,
    StepControl,
    StepRunner,
    cancelled,
    check_model,
)
from model_gateway.gateway.catalog import ConfigCatalog
from model_gateway.gateway.cluster.background import stop_tasks
from model_gateway.gateway.inference.tokens import message_output
from model_gateway.gateway.metering.storage_meter import owner_check
from model_gateway.pipeline.endpoint import Endpoint, RouteTable
from model_gateway.pipeline.errors import Conflict, InvalidRequest, NotFound
from model_gateway.pipeline.ports import Meter
from model_gateway.storage import ProjectRecord, Storage
from model_gateway.storage.base import AgentRecord, RunRecord, StepRecord, new_id, now_s

log = logging.getLogger("gateway.agents")

TOOLS = frozenset({"sandbox"})
MAX_STEPS_LIMIT = 100
MAX_INPUT_BYTES = 100 * 1024
ABANDONED: dict[str, Any] = {
    "type": "internal_error",
    "message": "The process running this run died or stopped renewing its lease before the"
    " run ended.",
}
# The end a run gets when storage refused the one it reached (the run must still end).
UNRECORDED: dict[str, Any] = {
    "type": "internal_error",
    "message": "The run's end could not be recorded.",
}
CAPACITY_RETRIES = 12  # sandbox capacity full: waits of retry-after (5 s), then the run fails
STOP_WAIT_S = 30.0  # at shutdown: a cancelled step settles within this, or the sweeper fails it

# How a run ends: its status, output and error object (storage's finish_run).
_End = tuple[str, str | None, dict[str, Any] | None]


class OwnedMeter(Meter, Protocol):
    """The gateway's meter: holds are leased to `owner`, and so are this process's runs."""

    @property
    def owner(self) -> str: ...


def _shutdown() -> RunStops:
    message = "The gateway stopped during the run."
    return RunStops("failed", {"type": "service_unavailable", "message": message})


def _endpoint(routes: RouteTable, method: str, path: str) -> Endpoint:
    found = routes.match(path)
    assert found is not None, path
    return found[0].methods[method]


@dataclass(slots=True)
class _Run:
    """A run in progress: what its loop reads, and its step counts."""

    run: RunRecord
    agent: AgentRecord
    control: StepControl
    seq: int = 0  # steps recorded (a capacity refusal included)
    taken: int = 0  # steps that ran: what max_steps counts


@dataclass(slots=True)
class _Live:
    task: asyncio.Task[None] | None = None
    control: StepControl = field(default_factory=StepControl)


class AgentEngine:
    def __init__(
        self,
        storage: Storage,
        meter: Meter,
        catalog: ConfigCatalog,
        *,
        owner: str,
        model_endpoint: Endpoint,
        sandbox_endpoint: Endpoint,
        lease_s: float,
    ) -> None:
        self.storage = storage
        self.catalog = catalog
        self.owner = owner
        self.lease_s = lease_s
        self.steps = StepRunner(
            storage,
            meter,
            catalog,
            model_endpoint=model_endpoint,
            sandbox_endpoint=sandbox_endpoint,
        )
        self.feed = RunFeed(storage)
        self._live: dict[str, _Live] = {}
        # Runs whose end could not be written (storage failed): retried by the sweeper.
        self._unfinished: dict[str, _End] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @classmethod
    def over_endpoints(
        cls,
        storage: Storage,
        meter: OwnedMeter,
        catalog: ConfigCatalog,
        routes: RouteTable,
        *,
        lease_s: float,
    ) -> AgentEngine:
        """Over the gateway's storage and meter, running steps through its own /v1
        endpoints (found in `routes`)."""
        return cls(
            storage,
            meter,
            catalog,
            owner=meter.owner,
            model_endpoint=_endpoint(routes, "POST", "/v1/chat/completions"),
            sandbox_endpoint=_endpoint(routes, "POST", "/v1/sandbox/executions"),
            lease_s=lease_s,
        )

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        await self._fail_abandoned()  # the runs of a process that died before this start
        self._sweeper = asyncio.create_task(self._sweep_forever())

    async def stop(self) -> None:
        """Stop the sweeper, then every run: each settles what ran and ends `failed`."""
        await stop_tasks(self._sweeper)
        tasks = [live.task for live in self._live.values() if live.task is not None]
        for live in list(self._live.values()):
            live.control.interrupt(_shutdown())
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT_S)

    # -- agents --------------------------------------------------------------------------

    async def create_agent(
        self,
        project_id: str,
        *,
        name: str,
        model: str,
        instructions: str = "",
        tools: list[str] | None = None,
        sandbox_id: str | None = None,
        max_steps: int = 8,
    ) -> AgentRecord:
        """A new agent of the project (GatewayError: 400, 404 not_found/model_not_found,
        403 model_not_allowed, 409 conflict for an archived project)."""
        project = await self._active_project(project_id)
        tools = list(tools or [])
        if not name or len(name) > 200:
            raise InvalidRequest("The name must have 1 to 200 characters.", param="name")
        if not set(tools) <= TOOLS or len(set(tools)) != len(tools):
            raise InvalidRequest('The only tool is "sandbox".', param="tools")
        if not 1 <= max_steps <= MAX_STEPS_LIMIT:
            raise InvalidRequest(f"max_steps must be 1 to {MAX_STEPS_LIMIT}.", param="max_steps")
        check_model(self.catalog, model, project, uses_tools=bool(tools))
        if "sandbox" in tools and sandbox_id is None:
            message = "An agent with the sandbox tool needs a sandbox_id."
            raise InvalidRequest(message, param="sandbox_id")
        if sandbox_id is not None:
            sandbox = await self.storage.get_sandbox(sandbox_id)
            if sandbox is None or sandbox.project_id != project.id:
                raise NotFound("No sandbox configuration with this ID exists.", param="sandbox_id")
        agent = AgentRecord(
            id=new_id("agt"),
            project_id=project.id,
            name=name,
            model=model,
            instructions=instructions,
            tools=tools,
            sandbox_id=sandbox_id,
            max_steps=max_steps,
            created_at=now_s(),
        )
        return await self.storage.create_agent(agent)

    async def get_agent(self, agent_id: str) -> AgentRecord | None:
        return await self.storage.get_agent(agent_id)

    async def list_agents(self, project_id: str) -> list[AgentRecord]:
        return await self.storage.list_agents(project_id)

    # -- runs ----------------------------------------------------------------------------

    async def start_run(self, agent: AgentRecord, *, input: str, budget: int) -> RunRecord:
        """Create the run and start it in the background (400, 409 archived project)."""
        project = await self._active_project(agent.project_id)
        if not input or len(input.encode()) > MAX_INPUT_BYTES:
            raise InvalidRequest("The input must be 1 byte to 100 KiB of text.", param="input")
        if budget < 0:
            raise InvalidRequest("The budget cannot be negative.", param="budget")
        now = now_s()
        run = RunRecord(
            id=new_id("run"),
            agent_id=agent.id,
            project_id=project.id,
            input=input,
            budget=budget,
            owner=self.owner,
            lease_until=int(now + self.lease_s),
            created_at=now,
        )
        live = self._live[run.id] = _Live()
        try:
            await self.storage.create_run(run)
        except BaseException:
            del self._live[run.id]
            raise
        live.task = asyncio.create_task(self._drive(run, agent, live.control), name=f"run {run.id}")
        return run

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.storage.get_run(run_id)

    async def run_steps(self, run_id: str) -> list[StepRecord]:
        return await self.storage.run_steps(run_id)

    async def list_runs(self, agent_id: str, limit: int = 50) -> list[RunRecord]:
        return await self.storage.list_runs(agent_id, limit)

    async def cancel(self, run_id: str) -> RunRecord:
        """Flag the run (any instance's); stop its step in flight if it runs here.
        RecordNotFound; StateConflict when it has already ended."""
        run = await self.storage.request_cancel(run_id)
        live = self._live.get(run_id)
        if live is not None:
            live.control.interrupt(cancelled())
        self.feed.notify(run_id)
        return run

    def events(self, run_id: str, after: int = 0) -> AsyncIterator[RunEvent]:
        """The run's steps as they close (from step `after` on), then `end`."""
        return self.feed.events(run_id, after)

    async def wait(self, run_id: str) -> RunRecord | None:
        """The run once it has ended (from any instance)."""
        async for _ in self.events(run_id):
            pass
        # The end event can arrive before a read on SQLite's shared reader connection sees
        # the committed end (a statement of another task keeps an older snapshot open):
        # read again, briefly, until the row shows it.
        for _ in range(50):
            run = await self.storage.get_run(run_id)
            if run is None or run.status != "running":
                return run
            await asyncio.sleep(0.05)
        return run

    async def _active_project(self, project_id: str, *, during_run: bool = False) -> ProjectRecord:
        project = await self.storage.get_project(project_id)
        if project is not None and project.state == "active":
            return project
        if during_run:  # like its keys' requests: forbidden from the next step on
            raise RunStops("failed", {"type": "forbidden", "message": "The project is archived."})
        if project is None:
            raise NotFound("No project with this ID exists.")
        raise Conflict("The project is archived.")

    # -- the loop ------------------------------------------------------------------------

    async def _drive(self, run: RunRecord, agent: AgentRecord, control: StepControl) -> None:
        status: str = "completed"
        output: str | None = None
        error: dict[str, Any] | None = None
        try:
            output = await self._loop(_Run(run, agent, control))
        except RunStops as stop:
            status, error = stop.status, stop.error
        except asyncio.CancelledError:  # the loop torn down past stop's wait: never completed
            shutdown = _shutdown()
            status, error = shutdown.status, shutdown.error
            raise
        except Exception:
            log.exception("run %s failed", run.id)
            status, error = "failed", {"type": "internal_error", "message": "The run failed."}
        finally:
            with anyio.CancelScope(shield=True):
                await self._finish(run.id, status, output, error)
            self._live.pop(run.id, None)
            self.feed.notify(run.id)

    async def _loop(self, state: _Run) -> str:
        """Model calls and their tool calls until a final answer; the answer."""
        agent = state.agent
        messages: list[dict[str, Any]] = []
        if agent.instructions:
            messages.append({"role": "system", "content": agent.instructions})
        messages.append({"role": "user", "content": state.run.input})
        request: dict[str, Any] = {"model": agent.model, "messages": messages}
        if "sandbox" in agent.tools:
            request["tools"] = [DEFINITION]
        while True:
            message = (await self._step(state, "model", request))["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            if not calls:
                # The answer's text: content may be OpenAI content parts (or a refusal),
                # and the run's output is text.
                return message_output(message, reasoning=False)
            messages.append(
                {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
            )
            for call in calls:
                try:
                    if "sandbox" not in agent.tools:
                        raise BadToolCall("This agent has no tools.")
                    args = parse_call(call)
                except BadToolCall as bad:  # the model's mistake: it may correct itself
                    messages.append(_tool_message(call, f"[error] {bad}"))
                    continue
                execution = {"sandbox_id": agent.sandbox_id, "runtime": args.runtime}
                answer = await self._step(state, "sandbox", {**execution, "code": args.code})
                messages.append(_tool_message(call, tool_result(answer)))

    async def _step(self, state: _Run, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """One step (waiting out full sandbox capacity); the endpoint's answer."""
        for attempt in range(CAPACITY_RETRIES + 1):
            if state.control.stop is not None:
                raise state.control.stop
            if state.taken >= state.agent.max_steps:
                raise RunStops("failed", _max_steps(state.agent.max_steps))
            # Read each time: an archived project, or a model policy changed, counts at once.
            project = await self._active_project(state.run.project_id, during_run=True)
            state.seq += 1
            try:
                answer = await self.steps.run(
                    kind, state.run, project, state.seq - 1, body, state.control
                )
            except RunStops as stop:
                wait_s = stop.error.get("retry_after_seconds")
                if wait_s is None or attempt == CAPACITY_RETRIES:
                    raise
                # Sandbox capacity is full for now (nothing ran, nothing billed): wait for
                # it rather than fail the run; a cancel still ends the wait at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.control.stopped.wait(), wait_s)
                continue
            finally:
                self.feed.notify(state.run.id)
            state.taken += 1
            return answer
        raise AssertionError("unreachable")

    async def _finish(
        self, run_id: str, status: str, output: str | None, error: dict[str, Any] | None
    ) -> None:
        end: _End = (status, output, error)
        try:
            await self._end(run_id, end)
        except Exception:
            log.exception("run %s could not be ended as %s; ending it failed", run_id, status)
            self._unfinished[run_id] = end
            await self._end_unfinished(run_id)

    async def _end(self, run_id: str, end: _End) -> None:
        if not await self.storage.finish_run(run_id, *end):
            log.warning("run %s had already been ended elsewhere", run_id)
        self._unfinished.pop(run_id, None)
        self.feed.notify(run_id)

    async def _end_unfinished(self, run_id: str) -> None:
        """A run whose end storage refused: that end once more (a passing failure), else
        `failed` (a value storage will never take); both refused, storage is unavailable:
        left for the sweeper's next turn, not logged again (the run was, once)."""
        for end in (self._unfinished[run_id], ("failed", None, UNRECORDED)):
            with contextlib.suppress(Exception):
                await self._end(run_id, end)
                return

    # -- the sweeper ---------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            await self.sweep()  # never raises: each part logs its own failure

    async def sweep(self) -> None:
        """Renew this process's leases, act on cancels from elsewhere, end the runs whose
        end storage refused, fail abandoned runs. Each part runs whatever another's fate:
        one run that cannot be ended must not keep dead instances' runs from failing."""
        for part in (self._renew, self._end_all_unfinished, self._fail_abandoned):
            try:
                await part()
            except Exception:
                log.exception("agent run sweep failed (%s); retrying", part.__name__)

    async def _renew(self) -> None:
        flagged = await self.storage.renew_run_leases(self.owner, int(time.time() + self.lease_s))
        for run_id in flagged:
            live = self._live.get(run_id)
            if live is not None:
                live.control.interrupt(cancelled())

    async def _end_all_unfinished(self) -> None:
        for run_id in list(self._unfinished):
            await self._end_unfinished(run_id)  # never raises: each run on its own

    async def _fail_abandoned(self) -> None:
        alive = await owner_check(self.storage)  # a dead instance's runs fail with its lease
        for run_id in await self.storage.fail_abandoned_runs(alive, ABANDONED):
            log.warning("run %s failed: its process stopped before it ended", run_id)
            self.feed.notify(run_id)


def _tool_message(call: dict[str, Any], content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.get("id") or "", "content": content}


def _max_steps(limit: int) -> dict[str, Any]:
    return {
        "type": "max_steps_exceeded",
        "message": f"The run reached its limit of {limit} steps without a final answer.",
    }
