"""An in-process gateway for agent tests, and the books every test checks."""

from __future__ import annotations

import itertools
import sqlite3
from decimal import Decimal
from pathlib import Path

from model_gateway.gateway.app import Gateway, open_gateway
from model_gateway.gateway.config import parse_config
from model_gateway.gateway.metering.pricing import held_output_tokens
from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.storage import ProjectRecord, SandboxRecord, open_storage
from model_gateway.storage.base import RunRecord, StepRecord
from tests.sandbox_e2e.helpers import NodeProcess, sandbox_config

NODE_SLOTS = 4
_ids = itertools.count()

# echo-1 as shipped; echo-steep holds a lot for its output and nothing for its input, so
# a test can tell exactly what its next model step will hold (STEEP_HOLD).
MODELS = """
[providers.local]
kind = "echo"

[models."echo-1"]
provider = "local"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
supports_tools = true
max_output_tokens = 4096

[models."echo-big"]
provider = "local"
input_price_per_mtok = "2"
output_price_per_mtok = "30"
supports_tools = true
max_output_tokens = 2000

[models."echo-steep"]
provider = "local"
input_price_per_mtok = "0"
output_price_per_mtok = "100"
supports_tools = true
max_output_tokens = 1000

[models."echo-notools"]
provider = "local"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
max_output_tokens = 1024
"""
# micro-units: the output echo-steep's 1000 tokens hold (their tolerance included, about
# 0.127 USD) at 100 USD per million
STEEP_HOLD = held_output_tokens(None, 1000) * 100


def micros(amount: str | Decimal) -> int:
    return int(Decimal(amount) * 1_000_000)


def gateway_config(folder: Path, node: NodeProcess, *, lease_s: float = 60) -> str:
    return f"""
[storage]
url = "sqlite:///data/gateway.db"

[secrets]
key_pepper_file = "data/key-pepper"
signing_key_file = "data/signing-key"
{MODELS}
{sandbox_config(node.url, node.secret_file, max_concurrent=NODE_SLOTS)}
[agents]
lease_s = {lease_s}
"""


class AgentGateway:
    def __init__(self, folder: Path, node: NodeProcess, *, lease_s: float = 60) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.db_path = folder / "data" / "gateway.db"
        self.config = parse_config(gateway_config(folder, node, lease_s=lease_s), base_dir=folder)
        self._gateway: Gateway | None = None

    @property
    def gateway(self) -> Gateway:
        assert self._gateway is not None, "start() first"
        return self._gateway

    async def start(self) -> None:
        self._gateway = await open_gateway(self.config)

    async def stop(self) -> None:
        await self.gateway.close()

    @property
    def engine(self):
        return self.gateway.agents

    @property
    def storage(self):
        return self.gateway.storage

    async def project(self, balance: str | int = "1.00") -> str:
        project_id = f"prj_agents{next(_ids)}"
        await self.storage.create_project(ProjectRecord(id=project_id, name="agents"))
        credit = balance if isinstance(balance, int) else micros(balance)
        if credit:
            await self.storage.add_credit(project_id, credit, current_month())
        return project_id

    async def sandbox(self, project_id: str, runtime: str = "python", timeout_s: int = 10) -> str:
        record = SandboxRecord(
            id=f"sbx_agents{next(_ids)}",
            project_id=project_id,
            runtime=runtime,
            timeout_s=timeout_s,
            memory_mb=128,
        )
        return (await self.storage.create_sandbox(record)).id

    async def tool_agent(
        self, project_id: str, model: str = "echo-1", *, timeout_s: int = 10, **options
    ):
        """An agent with the sandbox tool, on a new python sandbox of the project."""
        sandbox = await self.sandbox(project_id, "python", timeout_s=timeout_s)
        return await self.engine.create_agent(
            project_id, name="tool", model=model, tools=["sandbox"], sandbox_id=sandbox, **options
        )

    async def run(self, agent, text: str, budget: str | int) -> RunRecord:
        """Start a run and wait for its end."""
        amount = budget if isinstance(budget, int) else micros(budget)
        run = await self.engine.start_run(agent, input=text, budget=amount)
        return await self.engine.wait(run.id)

    def receipts(self, project_id: str) -> dict[str, tuple]:
        """receipt id -> (cost, kind, subject, key_id, status), read from the file."""
        with sqlite3.connect(self.db_path) as db:
            rows = db.execute(
                "SELECT id, cost, kind, model_or_runtime, key_id, status FROM receipts"
                " WHERE project_id = ?",
                (project_id,),
            ).fetchall()
        return {row[0]: row[1:] for row in rows}

    async def check_books(self, project_id: str, credit: int, runs: list[RunRecord]) -> None:
        """The invariants every agent test ends on: budgets held, project books exact,
        every settled step has its receipt, nothing left reserved or in flight. Read
        through a handle of its own: nothing else's open statement can age its view."""
        storage = await open_storage(f"sqlite:///{self.db_path}")
        try:
            await _check_books(storage, self.receipts(project_id), project_id, credit, runs)
        finally:
            await storage.close()


async def _check_books(storage, receipts, project_id: str, credit: int, runs) -> None:
    audit = await storage.audit(project_id, current_month())
    assert audit.balance == audit.ledger_sum == credit - sum(r[0] for r in receipts.values())
    assert audit.reserved == audit.open_reservations_sum == 0
    step_receipts: dict[str, int] = {}
    for run in runs:
        run = await storage.get_run(run.id)
        steps = await storage.run_steps(run.id)
        assert run.status != "running"
        assert 0 <= run.spent <= run.budget
        assert run.in_flight == 0
        assert run.spent == sum(step.cost for step in steps)
        for step in steps:
            check_step(step, receipts)
            if step.receipt_id is not None:
                step_receipts[step.receipt_id] = step.cost
        assert (run.status == "completed") == (run.error is None)
    # Every receipt of the project is one step's: agent steps are its only spending.
    assert step_receipts == {rid: r[0] for rid, r in receipts.items()}


def check_step(step: StepRecord, receipts: dict[str, tuple]) -> None:
    assert step.state in ("settled", "released") and step.closed_at is not None
    assert step.cost <= step.hold
    if step.state == "released":
        assert step.cost == 0 and step.receipt_id is None
        return
    cost, kind, subject, key_id, _ = receipts[step.receipt_id]
    assert (cost, subject, key_id) == (step.cost, step.subject, None)
    assert kind == {"model": "inference", "sandbox": "sandbox"}[step.kind]
