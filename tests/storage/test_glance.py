"""The SQLite backend's small reads on the loop's thread (`_glance`): the log's and the
lease meter's reads, taken several times a second, no longer queue on aiosqlite's one
thread behind a long read, and a read that finds SQLite busy is left to that thread."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

from model_gateway.storage.sqlite import SQLiteStorage, _read_unless_busy

# About a second of SQLite's work on aiosqlite's thread (an audit, an export).
SLOW_READ = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000)"
    " SELECT count(*) FROM n"
)


async def test_the_logs_reads_do_not_wait_behind_a_long_read(tmp_path) -> None:
    store = await SQLiteStorage.open(f"sqlite:///{tmp_path}/gw.db")
    try:
        started = time.monotonic()
        slow = asyncio.create_task(store._fetchall(SLOW_READ))
        await asyncio.sleep(0.05)  # the long read is on aiosqlite's thread now
        assert await store.tree_head() is None
        assert await store.unlogged_receipt_ids(257) == []
        assert await store.recalled_leases("gw:1:1") == []
        glanced_s = time.monotonic() - started
        await slow
        slow_s = time.monotonic() - started
    finally:
        await store.close()
    assert slow_s > 0.3, "the long read was too short to tell"
    assert glanced_s < slow_s / 2


def test_a_busy_database_is_left_to_the_thread_and_other_errors_raise(tmp_path) -> None:
    path = tmp_path / "rollback.db"  # a rollback journal: a writer's lock blocks readers
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("CREATE TABLE t (x)")
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("PRAGMA busy_timeout = 0")
    assert _read_unless_busy(reader, "SELECT count(*) FROM t", ()) == [(0,)]
    writer.execute("BEGIN EXCLUSIVE")
    try:
        assert _read_unless_busy(reader, "SELECT count(*) FROM t", ()) is None
    finally:
        writer.execute("ROLLBACK")
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        _read_unless_busy(reader, "SELECT * FROM missing", ())
