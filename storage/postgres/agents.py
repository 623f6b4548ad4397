"""Hosted agents, their runs and steps (AgentsPort) on PostgreSQL: the money moves in
triggers (migrations/postgres/0005_agents.sql: the run row is locked at admission)."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from model_gateway.storage.errors import RecordNotFound, StateConflict
from model_gateway.storage.postgres.connection import Connection, PostgresBase, Row
from model_gateway.storage.postgres.rows import _fields
from model_gateway.storage.records import AgentRecord, RunRecord, StepRecord, now_s


def _json_or_none(value: dict[str, object] | None) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _agent(row: Row) -> AgentRecord:
    return AgentRecord(**{**_fields(row, AgentRecord), "tools": orjson.loads(row["tools"])})


def _agent_run(row: Row) -> RunRecord:
    fields = _fields(row, RunRecord)
    fields["cancel_requested"] = bool(fields["cancel_requested"])
    fields["error"] = None if row["error"] is None else orjson.loads(row["error"])
    return RunRecord(**fields)


def _step(row: Row) -> StepRecord:
    fields = _fields(row, StepRecord)
    for name in ("error", "transcript"):
        fields[name] = None if row[name] is None else orjson.loads(row[name])
    return StepRecord(**fields)


class PostgresAgents(PostgresBase):
    """Agents, runs and steps."""

    async def create_agent(self, agent: AgentRecord) -> AgentRecord:
        a = agent
        # An unknown project fails the foreign key: RecordNotFound.
        await self._run(
            lambda c: c.execute(
                "INSERT INTO agents (id, project_id, name, model, instructions, tools,"
                " sandbox_id, max_steps, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                a.id,
                a.project_id,
                a.name,
                a.model,
                a.instructions,
                orjson.dumps(a.tools).decode(),
                a.sandbox_id,
                a.max_steps,
                a.created_at,
            )
        )
        return agent

    async def get_agent(self, agent_id: str) -> AgentRecord | None:
        return await self._one(_agent, "SELECT * FROM agents WHERE id = $1", agent_id)

    async def list_agents(self, project_id: str) -> list[AgentRecord]:
        return await self._all(
            _agent, "SELECT * FROM agents WHERE project_id = $1 ORDER BY created_at, id", project_id
        )

    async def create_run(self, run: RunRecord) -> RunRecord:
        r = run
        await self._run(
            lambda c: c.execute(
                "INSERT INTO agent_runs (id, agent_id, project_id, input, budget, owner,"
                " lease_until, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                r.id,
                r.agent_id,
                r.project_id,
                r.input,
                r.budget,
                r.owner,
                r.lease_until,
                r.created_at,
            )
        )
        return run

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._one(_agent_run, "SELECT * FROM agent_runs WHERE id = $1", run_id)

    async def list_runs(self, agent_id: str, limit: int = 50) -> list[RunRecord]:
        return await self._all(
            _agent_run,
            "SELECT * FROM agent_runs WHERE agent_id = $1"
            " ORDER BY created_at DESC, id DESC LIMIT $2",
            agent_id,
            limit,
        )

    async def run_steps(self, run_id: str) -> list[StepRecord]:
        return await self._all(
            _step, "SELECT * FROM agent_steps WHERE run_id = $1 ORDER BY seq", run_id
        )

    async def begin_step(self, step: StepRecord) -> None:
        s = step
        # The trigger `agent_step_admits` locks the run, checks and holds in this statement.
        await self._run(
            lambda c: c.execute(
                "INSERT INTO agent_steps (run_id, seq, kind, subject, hold, created_at)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                s.run_id,
                s.seq,
                s.kind,
                s.subject,
                s.hold,
                s.created_at,
            )
        )

    async def drop_step(self, run_id: str, seq: int) -> None:
        await self._run(
            lambda c: c.execute(
                "DELETE FROM agent_steps WHERE run_id = $1 AND seq = $2 AND state = 'in_flight'"
                " AND reservation_id IS NULL",
                run_id,
                seq,
            )
        )

    async def attach_step_hold(self, run_id: str, seq: int, reservation_id: str) -> None:
        await self._run(
            lambda c: c.execute(
                "UPDATE agent_steps SET reservation_id = $1 WHERE run_id = $2 AND seq = $3",
                reservation_id,
                run_id,
                seq,
            )
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
        await self._run(
            lambda c: c.execute(
                "UPDATE agent_steps SET input_tokens = $1, output_tokens = $2, duration_ms = $3,"
                " error = $4, transcript = $5,"
                " state = CASE state WHEN 'in_flight' THEN 'released' ELSE state END,"
                " closed_at = $6 WHERE run_id = $7 AND seq = $8",
                input_tokens,
                output_tokens,
                duration_ms,
                _json_or_none(error),
                _json_or_none(transcript),
                now_s(),
                run_id,
                seq,
            )
        )

    async def finish_run(
        self, run_id: str, status: str, output: str | None, error: dict[str, object] | None
    ) -> bool:
        # The status change releases the run's holds in flight (trigger agent_run_ends).
        ended = await self._run(
            lambda c: c.execute(
                "UPDATE agent_runs SET status = $1, output = $2, error = $3, finished_at = $4"
                " WHERE id = $5 AND status = 'running'",
                status,
                output,
                _json_or_none(error),
                now_s(),
                run_id,
            )
        )
        return bool(ended == "UPDATE 1")

    async def request_cancel(self, run_id: str) -> RunRecord:
        async def flag(conn: Connection) -> Row:
            row = await conn.fetchrow(
                "UPDATE agent_runs SET cancel_requested = true"
                " WHERE id = $1 AND status = 'running' RETURNING *",
                run_id,
            )
            if row is None:
                status = await conn.fetchval("SELECT status FROM agent_runs WHERE id = $1", run_id)
                if status is None:
                    raise RecordNotFound(f"no run {run_id}")
                raise StateConflict(f"run {run_id} has already ended ({status})")
            return row

        return _agent_run(await self._run(flag))

    async def renew_run_leases(self, owner: str, lease_until: int) -> list[str]:
        rows = await self._run(
            lambda c: c.fetch(
                "UPDATE agent_runs SET lease_until = $1 WHERE owner = $2 AND status = 'running'"
                " RETURNING id, cancel_requested",
                lease_until,
                owner,
            )
        )
        return sorted(row["id"] for row in rows if row["cancel_requested"])

    async def _fail_run(
        self, run_id: str, owner_dead: bool, now: int, error: dict[str, object]
    ) -> bool:
        """Fail a run still running and still abandoned, judged under its row lock: a run
        renewed or ended meanwhile stays as it is. Its end releases its holds in flight."""
        ended = await self._run(
            lambda c: c.execute(
                "UPDATE agent_runs SET status = 'failed', error = $1, finished_at = $2"
                " WHERE id = $3 AND status = 'running' AND (lease_until < $2 OR $4)",
                _json_or_none(error),
                now,
                run_id,
                owner_dead,
            )
        )
        return bool(ended == "UPDATE 1")

    async def fail_abandoned_runs(
        self, owner_alive: Callable[[str], bool | None], error: dict[str, object]
    ) -> list[str]:
        rows = await self._run(
            lambda c: c.fetch(
                "SELECT id, owner, lease_until FROM agent_runs WHERE status = 'running'"
            )
        )
        now = now_s()
        # Owners are checked once each: /proc reads, not one per run.
        alive = {row["owner"]: owner_alive(row["owner"]) for row in rows}
        abandoned = [
            (row["id"], alive[row["owner"]] is False)
            for row in rows
            if row["lease_until"] < now or alive[row["owner"]] is False
        ]
        failed = []
        for run_id, dead in abandoned:
            if await self._fail_run(run_id, dead, now, error):
                failed.append(run_id)
        return failed
