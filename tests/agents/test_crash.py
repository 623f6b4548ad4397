"""A process dies (kill -9) in the middle of a run: its run must not stay `running`, and
nothing it held may stay held. A restart fails it at once (its owner is gone); a live
instance elsewhere fails it once its lease expires."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.storage import open_storage
from model_gateway.storage.base import AgentRecord, RunRecord, StepRecord, now_s
from tests.agents.support import micros
from tests.sandbox_e2e.helpers import sandbox_config
from tests.support.gateway_process import GatewayProcess

WORKER = Path(__file__).with_name("run_worker.py")


async def _read(db_path: Path, project_id: str, run_id: str):
    storage = await open_storage(f"sqlite:///{db_path}")
    try:
        run = await storage.get_run(run_id)
        steps = await storage.run_steps(run_id)
        audit = await storage.audit(project_id, current_month())
    finally:
        await storage.close()
    return run, steps, audit


def test_a_run_of_a_killed_process_fails_at_restart_and_its_holds_go(tmp_path, executing):
    extra = sandbox_config(executing.url, executing.secret_file, max_concurrent=4)
    gw = GatewayProcess(tmp_path, extra_config=extra + "\n[agents]\nlease_s = 2\n")
    project = gw.create_project("crash", "--balance", "1")
    sandbox = gw.cli("sandboxes", "create", "--project", project, "--runtime", "python",
                     "--timeout-s", "30")["id"]  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), str(gw.config_path), project, sandbox],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        run_id = json.loads(worker.stdout.readline())["run_id"]
        db_path = tmp_path / "data" / "gateway.db"
        run, steps, audit = asyncio.run(_read(db_path, project, run_id))
        assert run.status == "running" and audit.reserved > 0
        states = [(s.kind, s.state) for s in steps]
        assert states == [("model", "settled"), ("sandbox", "in_flight")]
    finally:
        worker.kill()  # SIGKILL: no shutdown code runs
        worker.wait()
        worker.stdout.close()
    run, _, audit = asyncio.run(_read(db_path, project, run_id))
    assert run.status == "running" and audit.reserved > 0  # the dead keep holding

    with gw:  # a restart of `gateway serve` on the same database
        run, steps, audit = asyncio.run(_read(db_path, project, run_id))
    assert run.status == "failed"
    assert run.error["type"] == "internal_error" and "process" in run.error["message"]
    assert [(s.kind, s.state) for s in steps] == [("model", "settled"), ("sandbox", "released")]
    assert steps[1].receipt_id is None and steps[1].cost == 0 and steps[1].closed_at
    assert run.spent == steps[0].cost and run.in_flight == 0
    assert audit.reserved == audit.open_reservations_sum == 0
    assert audit.balance == audit.ledger_sum == micros("1") - run.spent


async def test_a_live_instance_fails_a_run_once_its_lease_expires(make_gateway):
    # A run owned by a process on another host: only its lease can tell it is gone.
    gw = await make_gateway(lease_s=1.5)
    project = await gw.project("1.00")
    agent = await gw.storage.create_agent(
        AgentRecord(id="agt_elsewhere", project_id=project, name="a", model="echo-1")
    )
    run = await gw.storage.create_run(
        RunRecord(
            id="run_elsewhere",
            agent_id=agent.id,
            project_id=project,
            input="x",
            budget=micros("0.50"),
            owner="elsewhere:1:1",
            lease_until=now_s() + 2,
        )
    )
    step = StepRecord(run_id=run.id, seq=0, kind="model", subject="echo-1", hold=5000)
    await gw.storage.begin_step(step)
    reservation = await gw.gateway.meter.reserve(project, None, 5000)
    await gw.storage.attach_step_hold(run.id, 0, reservation.id)

    await gw.engine.sweep()
    assert (await gw.storage.get_run(run.id)).status == "running"  # its lease holds
    ended = await asyncio.wait_for(gw.engine.wait(run.id), 10)  # the sweeper, on its own
    assert ended.status == "failed" and "lease" in ended.error["message"]
    assert ended.finished_at >= run.lease_until
    [step] = await gw.storage.run_steps(run.id)
    assert (step.state, step.cost) == ("released", 0)
    await gw.check_books(project, micros("1.00"), [ended])
