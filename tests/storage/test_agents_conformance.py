"""The hosted agents' storage on every backend: a run's budget kept by the statements that
move the money (admission, settlement, release, the run's end, a sweep)."""

from __future__ import annotations

import asyncio

import pytest

from model_gateway.storage import open_storage
from model_gateway.storage.base import (
    AgentRecord,
    LimitReached,
    ProjectRecord,
    ReceiptRecord,
    RecordNotFound,
    ReservationRecord,
    RunRecord,
    StateConflict,
    StepRecord,
    new_id,
)

MONTH = "2026-11"


@pytest.fixture
async def storage(storage_url):
    backend = await open_storage(storage_url)
    yield backend
    await backend.close()


async def run_of(storage, budget: int, owner: str = "ag:1:1", lease_until: int = 2**40):
    pid = new_id("prj")
    await storage.create_project(ProjectRecord(id=pid, name="agents"))
    await storage.add_credit(pid, 10_000, MONTH)
    agent = await storage.create_agent(
        AgentRecord(id=new_id("agt"), project_id=pid, name="a", model="echo-1", created_at=1)
    )
    run = await storage.create_run(
        RunRecord(
            id=new_id("run"),
            agent_id=agent.id,
            project_id=pid,
            input="hi",
            budget=budget,
            owner=owner,
            lease_until=lease_until,
            created_at=2,
        )
    )
    return pid, agent, run


async def step_with_hold(storage, pid, run, seq: int, hold: int) -> ReservationRecord:
    await storage.begin_step(
        StepRecord(run_id=run.id, seq=seq, kind="model", subject="echo-1", hold=hold)
    )
    reservation = ReservationRecord(
        id=new_id("rsv"),
        project_id=pid,
        key_id=None,
        amount=hold,
        month=MONTH,
        owner=run.owner,
        lease_until=2**40,
        created_at=0,
    )
    await storage.reserve(reservation)
    await storage.attach_step_hold(run.id, seq, reservation.id)
    return reservation


def receipt(reservation: ReservationRecord, cost: int) -> ReceiptRecord:
    return ReceiptRecord(
        id=new_id("rcpt"),
        reservation_id=reservation.id,
        project_id=reservation.project_id,
        key_id=None,
        request_id="req",
        kind="inference",
        endpoint="/v1/responses",
        model_or_runtime="echo-1",
        status="succeeded",
        usage={},
        cost=cost,
        month=MONTH,
        created_at=0,
        request_sha256="a" * 64,
        response_sha256="b" * 64,
    )


async def test_agents_and_runs_round_trip(storage):
    pid, agent, run = await run_of(storage, 100)
    assert await storage.get_agent(agent.id) == agent
    assert await storage.list_agents(pid) == [agent]
    assert await storage.get_agent("agt_missing") is None
    assert await storage.get_run(run.id) == run
    assert await storage.list_runs(agent.id) == [run]
    with pytest.raises(RecordNotFound):
        await storage.create_agent(
            AgentRecord(id=new_id("agt"), project_id="prj_missing", name="a", model="m")
        )


async def test_a_step_settled_and_a_step_released_move_the_run_budget(storage):
    pid, _, run = await run_of(storage, 100)
    first = await step_with_hold(storage, pid, run, 0, 60)
    with pytest.raises(LimitReached):  # 60 in flight + 50 > 100
        await storage.begin_step(
            StepRecord(run_id=run.id, seq=1, kind="model", subject="echo-1", hold=50)
        )
    assert await storage.settle(receipt(first, 25))
    assert ((r := await storage.get_run(run.id)).spent, r.in_flight) == (25, 0)
    second = await step_with_hold(storage, pid, run, 1, 75)
    await storage.release(second.id)
    assert ((r := await storage.get_run(run.id)).spent, r.in_flight) == (25, 0)
    await storage.describe_step(
        run.id, 1, input_tokens=1, output_tokens=2, duration_ms=3, error={"type": "x"}
    )
    steps = await storage.run_steps(run.id)
    assert [(s.state, s.cost) for s in steps] == [("settled", 25), ("released", 0)]
    assert steps[1].error == {"type": "x"} and steps[1].closed_at is not None
    # A step whose project hold was refused is dropped, freeing the run's budget.
    await storage.begin_step(
        StepRecord(run_id=run.id, seq=2, kind="model", subject="echo-1", hold=70)
    )
    await storage.drop_step(run.id, 2)
    assert (await storage.get_run(run.id)).in_flight == 0
    assert (await storage.project_account(pid, MONTH)).reserved == 0


async def test_the_end_of_a_run_releases_its_holds_and_refuses_new_steps(storage):
    pid, _, run = await run_of(storage, 100)
    await step_with_hold(storage, pid, run, 0, 40)
    assert (await storage.project_account(pid, MONTH)).reserved == 40
    assert await storage.finish_run(run.id, "failed", None, {"type": "internal_error"})
    assert not await storage.finish_run(run.id, "completed", "x", None)
    ended = await storage.get_run(run.id)
    assert (ended.status, ended.in_flight, ended.error) == ("failed", 0, {"type": "internal_error"})
    assert (await storage.project_account(pid, MONTH)).reserved == 0
    assert [s.state for s in await storage.run_steps(run.id)] == ["released"]
    with pytest.raises(StateConflict) as refused:
        await storage.begin_step(
            StepRecord(run_id=run.id, seq=1, kind="model", subject="echo-1", hold=1)
        )
    assert "run_not_running" in str(refused.value)
    with pytest.raises(StateConflict):
        await storage.request_cancel(run.id)
    with pytest.raises(RecordNotFound):
        await storage.request_cancel("run_missing")


async def test_cancel_leases_and_abandoned_runs(storage):
    owner = new_id("owner")
    _, _, run = await run_of(storage, 100, owner=owner)
    flagged = await storage.request_cancel(run.id)
    assert flagged.cancel_requested
    with pytest.raises(StateConflict) as refused:
        await storage.begin_step(
            StepRecord(run_id=run.id, seq=0, kind="model", subject="echo-1", hold=1)
        )
    assert "run_cancelled" in str(refused.value)
    assert await storage.renew_run_leases(owner, 2**41) == [run.id]
    _, _, expired = await run_of(storage, 100, owner=owner + "x", lease_until=1)
    failed = await storage.fail_abandoned_runs(lambda o: None, {"type": "abandoned"})
    assert expired.id in failed and run.id not in failed
    assert (await storage.get_run(expired.id)).status == "failed"
    dead = await storage.fail_abandoned_runs(
        lambda o: True if o == owner else None, {"type": "abandoned"}
    )
    assert run.id not in dead
    gone = await storage.fail_abandoned_runs(lambda o: False if o == owner else None, {})
    assert run.id in gone


async def test_concurrent_steps_never_exceed_the_run_budget(storage_url):
    handles = [await open_storage(storage_url) for _ in range(3)]
    try:
        _, _, run = await run_of(handles[0], 100)
        outcomes = await asyncio.gather(
            *(
                handles[i % 3].begin_step(
                    StepRecord(run_id=run.id, seq=i, kind="model", subject="echo-1", hold=30)
                )
                for i in range(9)
            ),
            return_exceptions=True,
        )
        assert sum(o is None for o in outcomes) == 3
        assert all(o is None or isinstance(o, LimitReached) for o in outcomes)
        assert (await handles[1].get_run(run.id)).in_flight == 90
    finally:
        for handle in handles:
            await handle.close()
