"""The SQLite backend's small reads on the loop's thread (`_glance`): the log's and the
lease meter's reads, taken several times a second, no longer queue on aiosqlite's one
thread behind a long read, and a read that finds SQLite busy is left to that thread."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from model_gateway.storage.sqlite import SQLiteStorage, _read_unless_busy
from model_gateway.storage.sqlite import connection as sqlite_module  # where `_glance` reads
from tests.support.records import offering_meter


async def test_the_logs_reads_do_not_wait_behind_a_long_read(tmp_path) -> None:
    store = await SQLiteStorage.open(f"sqlite:///{tmp_path}/gw.db")
    release = threading.Event()
    try:
        # A read that holds aiosqlite's thread until told (an audit, an export).
        await store._conn.create_function("held", 0, lambda: release.wait(10))
        long_read = asyncio.create_task(store._fetchall("SELECT held()"))
        await asyncio.sleep(0.05)  # on the thread now
        async with asyncio.timeout(2):  # not the 10 s the long read may last
            assert await store.tree_head() is None
            assert await store.unlogged_receipt_ids(257) == []
            assert await store.recalled_leases("gw:1:1") == []
        assert not long_read.done()
        release.set()
        await long_read
    finally:
        release.set()
        await store.close()


async def test_a_read_that_finds_sqlite_busy_is_taken_on_the_thread(tmp_path, monkeypatch):
    store = await SQLiteStorage.open(f"sqlite:///{tmp_path}/gw.db")
    try:
        charge = await offering_meter(store, lambda _: None)
        settled = await charge()
        on_the_loop = await store.unlogged_receipt_ids(2)
        monkeypatch.setattr(sqlite_module, "_read_unless_busy", lambda *_: None)  # busy
        assert await store.unlogged_receipt_ids(2) == on_the_loop
        assert [receipt_id for receipt_id, _ in on_the_loop] == [settled]
        assert await store.tree_head() is None
    finally:
        await store.close()


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
