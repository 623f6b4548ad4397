"""Holds and runs of another host's instance: released (failed) once its registry lease
ended, even while their own leases run; those of a live or unknown instance stay."""

from __future__ import annotations

import asyncio
import time

import pytest

from model_gateway.gateway.metering.storage_meter import owner_check
from model_gateway.storage import ProjectRecord, ReservationRecord, open_storage
from model_gateway.storage.base import AgentRecord, RunRecord

MONTH = "2026-11"
FAR = 2**40  # their own leases never end during the test


@pytest.fixture
async def storage(fresh_storage_url):
    """An empty database: the sweeps below judge every hold and run in it."""
    backend = await open_storage(fresh_storage_url)
    yield backend
    await backend.close()


def hold(pid: str, owner: str) -> ReservationRecord:
    return ReservationRecord(
        id=f"rsv_{owner.replace(':', '_')}",
        project_id=pid,
        key_id=None,
        amount=100,
        month=MONTH,
        owner=owner,
        lease_until=FAR,
        created_at=0,
    )


def run(agent: AgentRecord, owner: str) -> RunRecord:
    return RunRecord(
        id=f"run_{owner.replace(':', '_')}",
        agent_id=agent.id,
        project_id=agent.project_id,
        input="hi",
        budget=1000,
        owner=owner,
        lease_until=FAR,
    )


async def test_a_dead_instance_elsewhere_loses_its_holds_and_runs(storage):
    tag = time.time_ns()
    dead, live, unknown = (f"otherhost-{tag}:{n}:{n}" for n in (101, 102, 103))
    pid = f"prj_owners_{tag}"
    await storage.create_project(ProjectRecord(id=pid, name="owners"))
    await storage.add_credit(pid, 10_000, MONTH)
    agent = await storage.create_agent(
        AgentRecord(id=f"agt_{tag}", project_id=pid, name="a", model="echo-1")
    )
    await storage.renew_instance(dead, 50, 0)  # its lease ends in 50 ms
    await storage.renew_instance(live, 60_000, 0)
    for owner in (dead, live, unknown):
        await storage.reserve(hold(pid, owner))
        await storage.create_run(run(agent, owner))
    await asyncio.sleep(0.2)

    alive = await owner_check(storage)
    assert (alive(dead), alive(live), alive(unknown)) == (False, None, None)
    assert await storage.release_abandoned(alive) == 1
    failed = await storage.fail_abandoned_runs(alive, {"type": "internal_error"})
    assert failed == [run(agent, dead).id]

    account = await storage.project_account(pid, MONTH)
    assert account.reserved == 200  # the live and the unknown instance's holds
    assert account.balance == 10_000
    statuses = {r.owner: r.status for r in await storage.list_runs(agent.id)}
    assert statuses == {dead: "failed", live: "running", unknown: "running"}
