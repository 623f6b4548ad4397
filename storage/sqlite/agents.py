"""Hosted agents, their runs and steps (AgentsPort) on SQLite: the money moves in
triggers (migrations/sqlite/0007_agents.sql)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import msgspec
import orjson

from model_gateway.storage.errors import RecordNotFound, StateConflict
from model_gateway.storage.records import AgentRecord, RunRecord, StepRecord, now_s
from model_gateway.storage.sqlite.connection import SQLiteBase


def _json_or_none(value: dict[str, object] | None) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _agent(row: sqlite3.Row) -> AgentRecord:
    return AgentRecord(**{**dict(row), "tools": orjson.loads(row["tools"])})


def _run(row: sqlite3.Row) -> RunRecord:
    fields = dict(row)
    fields["cancel_requested"] = bool(fields["cancel_requested"])
    fields["error"] = None if row["error"] is None else orjson.loads(row["error"])
    return RunRecord(**fields)


def _step(row: sqlite3.Row) -> StepRecord:
    fields = dict(row)
    for name in ("error", "transcript"):
        fields[name] = None if row[name] is None else orjson.loads(row[name])
    return StepRecord(**fields)


class SQLiteAgents(SQLiteBase):
    """Agents, runs and steps."""

    async def create_agent(self, agent: AgentRecord) -> AgentRecord:
        if await self.get_project(agent.project_id) is None:
            raise RecordNotFound(f"no project {agent.project_id}")
        a = agent
        await self._write(
            "INSERT INTO agents (id, project_id, name, model, instructions, tools, sandbox_id,"
            " max_steps, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                a.id,
                a.project_id,
                a.name,
                a.model,
                a.instructions,
                orjson.dumps(a.tools).decode(),
                a.sandbox_id,
                a.max_steps,
                a.created_at,
            ),
        )
        return agent

    async def get_agent(self, agent_id: str) -> AgentRecord | None:
        return await self._one(_agent, "SELECT * FROM agents WHERE id = ?", (agent_id,))

    async def list_agents(self, project_id: str) -> list[AgentRecord]:
        return await self._all(
            _agent,
            "SELECT * FROM agents WHERE project_id = ? ORDER BY created_at, id",
            (project_id,),
        )

    async def create_run(self, run: RunRecord) -> RunRecord:
        r = run
        await self._write(
            "INSERT INTO agent_runs (id, agent_id, project_id, input, budget, owner, lease_until,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (r.id, r.agent_id, r.project_id, r.input, r.budget, r.owner, r.lease_until,
             r.created_at),
        )  # fmt: skip
        return run

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._one(_run, "SELECT * FROM agent_runs WHERE id = ?", (run_id,))

    async def list_runs(self, agent_id: str, limit: int = 50) -> list[RunRecord]:
        return await self._all(
            _run,
            "SELECT * FROM agent_runs WHERE agent_id = ? ORDER BY created_at DESC, id DESC LIMIT ?",
            (agent_id, limit),
        )

    async def run_steps(self, run_id: str) -> list[StepRecord]:
        return await self._all(
            _step, "SELECT * FROM agent_steps WHERE run_id = ? ORDER BY seq", (run_id,)
        )

    async def begin_step(self, step: StepRecord) -> None:
        s = step
        await self._write(
            "INSERT INTO agent_steps (run_id, seq, kind, subject, hold, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (s.run_id, s.seq, s.kind, s.subject, s.hold, s.created_at),
        )

    async def drop_step(self, run_id: str, seq: int) -> None:
        await self._write(
            "DELETE FROM agent_steps WHERE run_id = ? AND seq = ? AND state = 'in_flight'"
            " AND reservation_id IS NULL",
            (run_id, seq),
        )

    async def attach_step_hold(self, run_id: str, seq: int, reservation_id: str) -> None:
        await self._write(
            "UPDATE agent_steps SET reservation_id = ? WHERE run_id = ? AND seq = ?",
            (reservation_id, run_id, seq),
        )

    async def describe_step(
        self,
        run_id: str,
        seq: int,
        *,
        input_tokens: int,
        output_tokens: int,
        duration_ms: int,
        error: dict[str, object] | None,
        transcript: dict[str, object] | None = None,
    ) -> None:
        await self._write(
            "UPDATE agent_steps SET input_tokens = ?, output_tokens = ?, duration_ms = ?,"
            " error = ?, transcript = ?,"
            " state = CASE state WHEN 'in_flight' THEN 'released' ELSE state END,"
            " closed_at = ? WHERE run_id = ? AND seq = ?",
            (input_tokens, output_tokens, duration_ms, _json_or_none(error),
             _json_or_none(transcript), now_s(), run_id, seq),
        )  # fmt: skip

    async def finish_run(
        self, run_id: str, status: str, output: str | None, error: dict[str, object] | None
    ) -> bool:
        ended = await self._write(
            "UPDATE agent_runs SET status = ?, output = ?, error = ?, finished_at = ?"
            " WHERE id = ? AND status = 'running'",
            (status, output, _json_or_none(error), now_s(), run_id),
        )
        return ended == 1

    async def request_cancel(self, run_id: str) -> RunRecord:
        flagged = await self._write(
            "UPDATE agent_runs SET cancel_requested = 1 WHERE id = ? AND status = 'running'",
            (run_id,),
        )
        run = await self.get_run(run_id)
        if run is None:
            raise RecordNotFound(f"no run {run_id}")
        if not flagged:
            raise StateConflict(f"run {run_id} has already ended ({run.status})")
        # The shared reader may not see the write yet (a statement of another task can
        # hold its snapshot open): the flag is known to be set.
        return msgspec.structs.replace(run, cancel_requested=True)

    async def renew_run_leases(self, owner: str, lease_until: int) -> list[str]:
        await self._write(
            "UPDATE agent_runs SET lease_until = ? WHERE owner = ? AND status = 'running'",
            (lease_until, owner),
        )
        rows = await self._fetchall(
            "SELECT id FROM agent_runs WHERE owner = ? AND status = 'running'"
            " AND cancel_requested <> 0",
            (owner,),
        )
        return [row["id"] for row in rows]

    async def fail_abandoned_runs(
        self, owner_alive: Callable[[str], bool | None], error: dict[str, object]
    ) -> list[str]:
        rows = await self._fetchall(
            "SELECT id, owner, lease_until FROM agent_runs WHERE status = 'running'"
        )
        now = now_s()
        # Owners are checked once each: /proc reads, not one per run.
        alive = {row["owner"]: owner_alive(row["owner"]) for row in rows}
        abandoned = [
            row["id"] for row in rows if row["lease_until"] < now or alive[row["owner"]] is False
        ]
        failed = []
        for run_id in abandoned:
            # The status change releases the run's holds in flight (trigger agent_run_ends).
            if await self.finish_run(run_id, "failed", None, error):
                failed.append(run_id)
        return failed
