"""A step's transcript on every backend (migration 0022): written with the step's
description, read back as it was (any text, a NUL character and non-ASCII included); a
step never described, described without one, or recorded before the migration reads as
None."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from model_gateway.storage import open_storage
from model_gateway.storage import sqlite as sqlite_backend
from model_gateway.storage.base import StepRecord
from model_gateway.storage.postgres import connection as postgres_connection
from model_gateway.storage.sqlite import connection as sqlite_connection
from tests.storage.test_agents_conformance import run_of, step_with_hold

SANDBOX = {
    "runtime": "python",
    "code": "print('<b>ü</b>\\0')",
    "stdout": "<b>ü</b>\x00\n",
    "stderr": "",
    "exit_code": 0,
    "status": "completed",
    "stdout_truncated": True,
}
MODEL = {
    "messages": [{"role": "user", "content": "Compute ```python\nprint(6*7)\n```"}],
    "reply": {
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "run_code", "arguments": '{"runtime": "python"}'},
            }
        ],
    },
}


@pytest.fixture
async def storage(storage_url):
    backend = await open_storage(storage_url)
    yield backend
    await backend.close()


async def test_a_steps_transcript_round_trips(storage):
    pid, _, run = await run_of(storage, 100)
    await step_with_hold(storage, pid, run, 0, 10)
    await step_with_hold(storage, pid, run, 1, 10)
    await step_with_hold(storage, pid, run, 2, 10)
    await step_with_hold(storage, pid, run, 3, 10)
    assert (await storage.run_steps(run.id))[0].transcript is None  # in flight
    for seq, transcript in ((0, MODEL), (1, SANDBOX)):
        await storage.describe_step(
            run.id,
            seq,
            input_tokens=1,
            output_tokens=2,
            duration_ms=3,
            error=None,
            transcript=transcript,
        )
    await storage.describe_step(
        run.id, 2, input_tokens=0, output_tokens=0, duration_ms=0, error=None
    )
    steps = await storage.run_steps(run.id)
    assert [s.transcript for s in steps] == [MODEL, SANDBOX, None, None]
    assert all(s.closed_at is not None for s in steps[:3]) and steps[3].closed_at is None


def _insert_old_step(execute) -> None:
    """A project, agent, run and one described step, as a gateway before 0022 wrote them."""
    execute("INSERT INTO projects (id, name, created_at) VALUES ('prj_old', 'p', 1)")
    execute(
        "INSERT INTO agents (id, project_id, name, model, created_at)"
        " VALUES ('agt_old', 'prj_old', 'a', 'echo-1', 1)"
    )
    execute(
        "INSERT INTO agent_runs (id, agent_id, project_id, input, budget, owner, lease_until,"
        " created_at) VALUES ('run_old', 'agt_old', 'prj_old', 'hi', 100, 'h:1:1', 9, 1)"
    )
    execute(
        "INSERT INTO agent_steps (run_id, seq, kind, subject, hold, created_at, closed_at)"
        " VALUES ('run_old', 0, 'sandbox', 'python', 0, 1, 2)"
    )


async def _old_step_read_after_migrating(url: str) -> StepRecord:
    storage = await open_storage(url)
    try:
        (step,) = await storage.run_steps("run_old")
    finally:
        await storage.close()
    return step


async def test_a_step_recorded_before_the_migration_reads_without_transcript_sqlite(
    tmp_path: Path,
):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for name, function in (
        ("gateway_pack", sqlite_backend._pack),
        ("gateway_usage", sqlite_backend._usage_part),
        ("gateway_response_commitment", sqlite_backend._response_commitment),
    ):
        conn.create_function(name, 2, function, deterministic=True)
    conn.execute(sqlite_connection._MIGRATION_NOTES)
    for number, script in sqlite_backend._migrations():
        if number >= 22:
            break
        conn.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
    _insert_old_step(conn.execute)
    conn.close()
    step = await _old_step_read_after_migrating(f"sqlite:///{path}")
    assert (step.kind, step.transcript, step.closed_at) == ("sandbox", None, 2)


@pytest.mark.postgres
async def test_a_step_recorded_before_the_migration_reads_without_transcript_postgres(
    fresh_postgres_url: str,
):
    conn = await asyncpg.connect(fresh_postgres_url)
    try:
        await conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY)")
        await conn.execute(
            "CREATE TABLE migration_notes (version INTEGER NOT NULL, note TEXT NOT NULL)"
        )
        for number, script in postgres_connection._migrations():
            if number >= 22:
                break
            await conn.execute(script)
            await conn.execute("INSERT INTO schema_migrations VALUES ($1)", number)
        statements: list[str] = []
        _insert_old_step(statements.append)
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()
    step = await _old_step_read_after_migrating(fresh_postgres_url)
    assert (step.kind, step.transcript, step.closed_at) == ("sandbox", None, 2)
