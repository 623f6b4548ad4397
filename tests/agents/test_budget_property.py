"""Run budgets under concurrency, as properties.

Storage alone: steps of arbitrary holds and costs racing on one run (as from several
instances) never take the run past its budget. The whole engine: concurrent runs of
arbitrary agents, budgets and tool-call depths on one project, over the real echo model,
the real node and a real SQLite file: every run ends within its budget, every settled
step has its receipt, and the project's books are exact with nothing left reserved.
"""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from model_gateway.gateway.metering.storage_meter import StorageMeter, current_month
from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.errors import GatewayError
from model_gateway.pipeline.hold import Hold
from model_gateway.storage import LimitReached, ProjectRecord, open_storage
from model_gateway.storage.base import AgentRecord, RunRecord, StepRecord
from tests.agents.support import AgentGateway

_ids = itertools.count()


def _settlement(step: StepRecord, cost: int) -> Settlement:
    return Settlement(
        receipt_id=f"rcpt_prop{next(_ids)}",
        request_id="req_prop",
        kind="inference",
        endpoint="/v1/chat/completions",
        subject="echo-1",
        status="succeeded",
        usage={"input_tokens": 1, "output_tokens": 1},
        cost=cost,
        request_body=b"{}",
        response_sha256=None,
    )


steps_strategy = st.lists(
    st.integers(0, 5_000).flatmap(lambda hold: st.tuples(st.just(hold), st.integers(0, hold))),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.integers(0, 12_000), balance=st.integers(0, 20_000), steps=steps_strategy)
def test_racing_steps_never_exceed_the_run_budget(tmp_path_factory, budget, balance, steps):
    asyncio.run(_race(tmp_path_factory.mktemp("race"), budget, balance, steps))


async def _race(folder, budget: int, balance: int, steps: list[tuple[int, int]]) -> None:
    storage = await open_storage(f"sqlite:///{folder / 'race.db'}")
    meter = StorageMeter(storage)
    try:
        await storage.create_project(ProjectRecord(id="prj_race", name="race"))
        if balance:
            await storage.add_credit("prj_race", balance, current_month())
        run = await _bare_run(storage, meter.owner, budget)
        spent_seen: list[int] = []

        async def step(seq: int, hold: int, cost: int) -> int:
            record = StepRecord(run_id=run.id, seq=seq, kind="model", subject="m", hold=hold)
            try:
                await storage.begin_step(record)
            except LimitReached:
                return 0
            try:
                taken = await Hold.take(meter, "prj_race", None, hold)
            except GatewayError:
                await storage.drop_step(run.id, seq)
                return 0
            async with taken:
                await storage.attach_step_hold(run.id, seq, taken.reservation.id)
                await asyncio.sleep(0)  # let the other steps interleave
                await taken.settle(_settlement(record, cost))
            spent_seen.append((await storage.get_run(run.id)).spent)
            return cost

        charged = await asyncio.gather(*(step(i, h, c) for i, (h, c) in enumerate(steps)))
        final = await storage.get_run(run.id)
        assert final.spent == sum(charged) <= budget
        assert final.in_flight == 0
        assert all(seen <= budget for seen in spent_seen)
        audit = await storage.audit("prj_race", current_month())
        assert audit.balance == audit.ledger_sum == balance - sum(charged)
        assert audit.reserved == audit.open_reservations_sum == 0
    finally:
        await storage.close()


async def _bare_run(storage, owner: str, budget: int) -> RunRecord:
    agent = await storage.create_agent(
        AgentRecord(id=f"agt_race{next(_ids)}", project_id="prj_race", name="a", model="m")
    )
    return await storage.create_run(
        RunRecord(
            id=f"run_race{next(_ids)}",
            agent_id=agent.id,
            project_id="prj_race",
            input="x",
            budget=budget,
            owner=owner,
            lease_until=2**40,
        )
    )


def _chain(depth: int) -> str:
    """A bash program that prints a fenced block holding the next program, `depth` deep:
    echo then calls run_code again for it. Backticks are printed as octal escapes so that
    no program contains a fence of its own."""
    code = "echo done"
    for level in range(depth):
        delimiter = f"NEXT{level}"
        code = (
            "printf '\\140\\140\\140bash\\n'\n"
            f"cat <<'{delimiter}'\n{code}\n{delimiter}\n"
            "printf '\\140\\140\\140\\n'"
        )
    return code


run_strategy = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["echo-1", "echo-big", "echo-steep"]),
        "timeout_s": st.integers(1, 3),
        "depth": st.integers(0, 3),
        # Around the holds' sizes (echo-1 ~6k, sandbox 11k-31k, echo-big ~60k, steep 100k);
        # hypothesis alone favours small integers.
        "budget": st.sampled_from([0, 5, 20, 60, 110, 150, 250, 400]).flatmap(
            lambda k: st.integers(k * 1000, k * 1000 + 9_999)
        ),
        "max_steps": st.integers(1, 8),
    }
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    balance=st.one_of(st.just(10_000_000), st.integers(0, 60).map(lambda k: k * 10_000)),
    runs=st.lists(run_strategy, min_size=1, max_size=4),
)
def test_concurrent_runs_keep_budgets_and_books(executing, tmp_path_factory, balance, runs):
    asyncio.run(_concurrent_runs(tmp_path_factory.mktemp("prop"), executing, balance, runs))


async def _concurrent_runs(folder, node, balance: int, runs: list[dict]) -> None:
    gw = AgentGateway(folder, node)
    await gw.start()
    try:
        project = await gw.project(balance)
        started = []
        for spec in runs:
            sandbox = await gw.sandbox(project, "bash", timeout_s=spec["timeout_s"])
            agent = await gw.engine.create_agent(
                project,
                name="prop",
                model=spec["model"],
                tools=["sandbox"],
                sandbox_id=sandbox,
                max_steps=spec["max_steps"],
            )
            depth = spec["depth"]
            text = f"```bash\n{_chain(depth - 1)}\n```" if depth else "hello"
            started.append(await gw.engine.start_run(agent, input=text, budget=spec["budget"]))
        ended = await asyncio.wait_for(
            asyncio.gather(*(gw.engine.wait(run.id) for run in started)), 120
        )
        await gw.check_books(project, balance, ended)
        for spec, run in zip(runs, ended, strict=True):
            steps = await gw.storage.run_steps(run.id)
            event(f"{(run.error or {}).get('type', run.status)}, {len(steps)} steps")
            assert len([s for s in steps if s.state == "settled"]) <= spec["max_steps"]
            if run.status == "completed":
                # depth sandbox steps, each answered by one more model call
                kinds = [s.kind for s in steps]
                assert kinds == ["model", *["sandbox", "model"] * spec["depth"]], [
                    (s.kind, s.state, s.error) for s in steps
                ]
                assert run.output == ("done\n" if spec["depth"] else "hello")
            else:
                assert run.status in ("budget_exceeded", "failed"), run.error
                assert run.error["type"] in (
                    "budget_exceeded",
                    "insufficient_balance",
                    "max_steps_exceeded",
                ), run.error
    finally:
        await gw.stop()
