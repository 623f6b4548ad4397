"""Real runs: the echo model, the real sandbox node, a real SQLite file, the real meter."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from model_gateway.gateway.agents.agent_views import (
    decode_agent_request,
    decode_run_request,
    run_view,
)
from model_gateway.gateway.proofs.log import Pending
from model_gateway.pipeline.errors import Conflict, InvalidRequest, NotFound
from model_gateway.storage import StateConflict, open_storage
from tests.agents.support import STEEP_HOLD, AgentGateway, micros
from tests.sandbox_e2e.helpers import PER_EXECUTION, PER_SECOND

SIX_TIMES_SEVEN = "Compute this:\n```python\nprint(6 * 7)\n```\n"


async def _in_flight_step(gw, run_id: str, kind: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for step in await gw.storage.run_steps(run_id):
            if step.kind == kind and step.state == "in_flight" and step.reservation_id:
                return step
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {kind} step of {run_id} came in flight")


async def test_a_run_completes_with_a_sandbox_step(gw):
    project = await gw.project("1.00")
    agent = await gw.tool_agent(project)
    run = await gw.engine.start_run(agent, input=SIX_TIMES_SEVEN, budget=micros("0.50"))
    events = [event async for event in gw.engine.events(run.id)]

    run = await gw.storage.get_run(run.id)
    steps = await gw.storage.run_steps(run.id)
    assert (run.status, run.output, run.error) == ("completed", "42\n", None)
    assert [(s.kind, s.subject) for s in steps] == [
        ("model", "echo-1"),
        ("sandbox", "python"),
        ("model", "echo-1"),
    ]
    assert steps[1].duration_ms > 0 and steps[0].output_tokens > 0
    # The feed gave every step as it closed (a step seen in flight announced before),
    # then the run.
    closed = [e for e in events if e.event != "step.started"]
    assert [e.event for e in closed] == ["step", "step", "step", "end"]
    assert [e.data for e in closed[:3]] == run_view(run, steps)["steps"]
    assert closed[-1].data == run_view(run, steps)
    for started in (e for e in events if e.event == "step.started"):
        position = events.index(started)
        assert events[position + 1].event == "step"
        assert started.data.items() <= events[position + 1].data.items()
    # A late subscriber sees the same closed steps and end.
    late = [e async for e in gw.engine.events(run.id)]
    assert [(e.event, e.data) for e in late] == [(e.event, e.data) for e in closed]
    await gw.check_books(project, micros("1.00"), [run])
    # Steps' receipts are like /v1's: the endpoint, and they reach the transparency log.
    receipt = await gw.storage.get_receipt(steps[1].receipt_id)
    assert (receipt.endpoint, receipt.status) == ("/v1/sandbox/executions", "succeeded")
    assert (await gw.storage.get_receipt(steps[0].receipt_id)).endpoint == "/v1/chat/completions"
    deadline = time.monotonic() + 10
    while True:
        try:
            assert await gw.gateway.transparency_log.proof(steps[1].receipt_id) is not None
            break
        except Pending:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)


async def test_a_run_without_tools_answers_in_one_step(gw):
    project = await gw.project("1.00")
    agent = await gw.engine.create_agent(project, name="echo", model="echo-1")
    run = await gw.run(agent, SIX_TIMES_SEVEN, "0.10")  # no tool: the code is only text
    assert (run.status, run.output) == ("completed", SIX_TIMES_SEVEN)
    assert len(await gw.storage.run_steps(run.id)) == 1
    await gw.check_books(project, micros("1.00"), [run])


async def test_a_budget_below_the_first_step_ends_before_it(gw):
    project = await gw.project("1.00")
    agent = await gw.engine.create_agent(project, name="steep", model="echo-steep")
    run = await gw.run(agent, "hello", STEEP_HOLD - 1)
    assert run.status == "budget_exceeded"
    assert run.error["type"] == "budget_exceeded"
    assert (run.spent, await gw.storage.run_steps(run.id)) == (0, [])
    assert gw.receipts(project) == {}
    await gw.check_books(project, micros("1.00"), [run])


async def test_a_run_ends_mid_way_when_the_next_step_does_not_fit(gw):
    # Step 1 (model) holds exactly STEEP_HOLD; step 2 (sandbox, 1 s) holds 0.011; step 3
    # holds STEEP_HOLD again, which no longer fits once the first two cost anything.
    project = await gw.project("1.00")
    agent = await gw.tool_agent(project, "echo-steep", timeout_s=1)
    budget = STEEP_HOLD + micros(PER_EXECUTION)
    run = await gw.run(agent, SIX_TIMES_SEVEN, budget)
    steps = await gw.storage.run_steps(run.id)
    assert run.status == "budget_exceeded" and run.error["type"] == "budget_exceeded"
    assert [(s.kind, s.state) for s in steps] == [("model", "settled"), ("sandbox", "settled")]
    assert 0 < run.spent == steps[0].cost + steps[1].cost <= budget
    assert run.spent + STEEP_HOLD > budget
    await gw.check_books(project, micros("1.00"), [run])


async def test_a_project_balance_below_the_step_fails_the_run(gw):
    project = await gw.project(STEEP_HOLD - 1)
    agent = await gw.engine.create_agent(project, name="steep", model="echo-steep")
    run = await gw.run(agent, "hello", "1.00")
    assert (run.status, run.error["type"]) == ("failed", "insufficient_balance")
    assert await gw.storage.run_steps(run.id) == []
    await gw.check_books(project, STEEP_HOLD - 1, [run])


async def test_max_steps_bounds_a_run(gw):
    project = await gw.project("1.00")
    agent = await gw.tool_agent(project, max_steps=1)
    run = await gw.run(agent, SIX_TIMES_SEVEN, "0.50")
    assert (run.status, run.error["type"]) == ("failed", "max_steps_exceeded")
    assert [s.kind for s in await gw.storage.run_steps(run.id)] == ["model"]
    await gw.check_books(project, micros("1.00"), [run])


async def test_cancel_stops_the_program_in_flight_and_bills_what_ran(gw):
    project = await gw.project("1.00")
    agent = await gw.tool_agent(project, timeout_s=30)
    slow = "```python\nimport time\ntime.sleep(10)\n```"
    run = await gw.engine.start_run(agent, input=slow, budget=micros("1.00"))
    await _in_flight_step(gw, run.id, "sandbox")
    feed = gw.engine.events(run.id)
    assert [(await anext(feed)).event for _ in range(2)] == ["step", "step.started"]
    await asyncio.sleep(0.3)
    asked = time.monotonic()
    assert (await gw.engine.cancel(run.id)).cancel_requested
    run = await gw.engine.wait(run.id)
    assert time.monotonic() - asked < 5  # not the program's 10 s
    assert (run.status, run.error["type"]) == ("cancelled", "cancelled")
    assert [e.event async for e in feed] == ["step", "end"]
    _, sandbox_step = await gw.storage.run_steps(run.id)
    assert sandbox_step.state == "settled" and sandbox_step.error["type"] == "cancelled"
    # Billed for the time it ran (at least the 0.3 s above), far below its 30 s hold.
    assert micros(PER_EXECUTION) + 3 * micros(PER_SECOND) // 10 <= sandbox_step.cost
    assert sandbox_step.cost < sandbox_step.hold // 2
    await gw.check_books(project, micros("1.00"), [run])
    with pytest.raises(StateConflict):
        await gw.engine.cancel(run.id)


async def test_a_cancel_from_another_instance_reaches_the_owner(make_gateway):
    gw = await make_gateway(lease_s=1.5)  # the owner looks for cancels every 0.5 s
    project = await gw.project("1.00")
    agent = await gw.tool_agent(project, timeout_s=30)
    run = await gw.engine.start_run(
        agent, input="```python\nimport time\ntime.sleep(10)\n```", budget=micros("1.00")
    )
    await _in_flight_step(gw, run.id, "sandbox")
    other = await open_storage(f"sqlite:///{gw.db_path}")  # another instance's handle
    try:
        await other.request_cancel(run.id)
    finally:
        await other.close()
    run = await asyncio.wait_for(gw.engine.wait(run.id), 5)
    assert run.status == "cancelled"
    await gw.check_books(project, micros("1.00"), [run])


async def test_concurrent_runs_on_one_project_stay_within_their_budgets(gw):
    project = await gw.project("1.00")
    agent = await gw.tool_agent(project, "echo-steep", timeout_s=1)
    budgets = [STEEP_HOLD - 1, STEEP_HOLD + micros(PER_EXECUTION), micros("0.50")] * 2
    runs = await asyncio.gather(*(gw.run(agent, SIX_TIMES_SEVEN, b) for b in budgets))
    assert [r.status for r in runs] == ["budget_exceeded", "budget_exceeded", "completed"] * 2, [
        r.error for r in runs
    ]
    await gw.check_books(project, micros("1.00"), runs)


async def test_agents_are_checked_when_created(gw):
    project = await gw.project("1.00")
    other = await gw.project("1.00")
    foreign = await gw.sandbox(other, "python")
    create = gw.engine.create_agent
    with pytest.raises(InvalidRequest) as missing:
        await create(project, name="a", model="echo-1", tools=["sandbox"])
    assert missing.value.param == "sandbox_id"
    with pytest.raises(NotFound):
        await create(project, name="a", model="echo-1", tools=["sandbox"], sandbox_id=foreign)
    with pytest.raises(InvalidRequest) as no_tools:
        await create(project, name="a", model="echo-notools", tools=["sandbox"], sandbox_id="x")
    assert no_tools.value.param == "tools"
    with pytest.raises(InvalidRequest):
        await create(project, name="a", model="echo-1", tools=["web"])
    agent = await create(project, name="a", model="echo-1")
    assert agent.max_steps == 8 and agent.id.startswith("agt_")
    assert [a.id for a in await gw.engine.list_agents(project)] == [agent.id]


async def test_archiving_the_project_stops_its_runs_at_the_next_step(gw):
    project = await gw.project("1.00")
    agent = await gw.tool_agent(project)
    code = "```python\nimport time\ntime.sleep(1)\nprint('late')\n```"
    run = await gw.engine.start_run(agent, input=code, budget=micros("0.50"))
    await _in_flight_step(gw, run.id, "sandbox")
    await gw.storage.archive_project(project)
    run = await gw.engine.wait(run.id)
    assert (run.status, run.error["type"]) == ("failed", "forbidden")
    # The program in flight finished and was billed; no model step after it.
    assert [(s.kind, s.state) for s in await gw.storage.run_steps(run.id)] == [
        ("model", "settled"),
        ("sandbox", "settled"),
    ]
    await gw.check_books(project, micros("1.00"), [run])
    with pytest.raises(Conflict):
        await gw.engine.start_run(agent, input="again", budget=1)


async def test_a_gateway_that_stops_ends_its_runs_and_settles_what_ran(tmp_path, executing):
    gw = AgentGateway(tmp_path / "stopping", executing)
    await gw.start()
    project = await gw.project("1.00")
    agent = await gw.tool_agent(project, timeout_s=30)
    run = await gw.engine.start_run(
        agent, input="```python\nimport time\ntime.sleep(10)\n```", budget=micros("1.00")
    )
    await _in_flight_step(gw, run.id, "sandbox")
    await gw.stop()
    storage = await open_storage(f"sqlite:///{gw.db_path}")
    try:
        run = await storage.get_run(run.id)
        assert (run.status, run.error["type"]) == ("failed", "service_unavailable")
        _, sandbox_step = await storage.run_steps(run.id)
        assert sandbox_step.state == "settled" and sandbox_step.cost > 0
        await gw.check_books(project, micros("1.00"), [run])
    finally:
        await storage.close()


async def test_a_run_whose_task_is_cancelled_ends_failed_never_completed(gw):
    """Past stop's wait, a loop torn down cancels what still runs: such a run ends as one
    the gateway stopped, never `completed` without an output."""
    project = await gw.project("1.00")
    agent = await gw.tool_agent(project, timeout_s=30)
    run = await gw.engine.start_run(
        agent, input="```python\nimport time\ntime.sleep(10)\n```", budget=micros("1.00")
    )
    await _in_flight_step(gw, run.id, "sandbox")
    (task,) = [task for task in asyncio.all_tasks() if task.get_name() == f"run {run.id}"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    run = await gw.storage.get_run(run.id)
    assert (run.status, run.output, run.error["type"]) == ("failed", None, "service_unavailable")


def test_console_bodies_decode_like_v1_bodies():
    request = decode_agent_request(b'{"name": "a", "model": "echo-1", "extra": 1}')
    assert msgspec.structs.asdict(request)["max_steps"] == 8
    with pytest.raises(InvalidRequest) as wrong:
        decode_agent_request(b'{"name": "a", "model": "echo-1", "max_steps": "8"}')
    assert wrong.value.param == "max_steps"
    assert decode_run_request(b'{"input": "x", "budget": "0.25"}').budget_micros == 250_000
    assert decode_run_request(b'{"input": "x", "budget": 0.1}').budget_micros == 100_000
    for budget in (b'"-1"', b'"0.0000001"', b'"abc"', b"true"):
        with pytest.raises(InvalidRequest) as refused:
            _ = decode_run_request(b'{"input": "x", "budget": ' + budget + b"}").budget_micros
        assert refused.value.param == "budget"
