"""The log's storage methods on a real SQLite file: what a second backend (PostgreSQL)
must do the same. An integration is all or nothing, entries and heads are never written
twice, and a stored tile only ever grows by appending."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from model_gateway.storage.base import LogEntry, LogTile, StateConflict, TreeHeadRecord


def h(i: int) -> bytes:
    return hashlib.sha256(b"%d" % i).digest()


def head(size: int) -> TreeHeadRecord:
    return TreeHeadRecord(
        size=size,
        root_hash=h(size).hex(),
        timestamp="2026-01-01T00:00:00.000000Z",
        key_id="0" * 16,
        signature="00" * 64,
    )


def tile(level: int, index: int, *hashes: int) -> LogTile:
    return LogTile(level=level, index=index, hashes=b"".join(h(i) for i in hashes))


async def test_an_integration_stores_entries_tiles_and_head_and_reads_them_back(storage, settle):
    a, b = await settle(), await settle()
    await storage.append_log_tiles(
        [LogEntry(leaf_index=0, receipt_id=a.id), LogEntry(leaf_index=1, receipt_id=b.id)],
        [tile(0, 0, 1, 2)],
        head(2),
    )
    assert await storage.log_tiles([(0, 0), (1, 0), (0, 5)]) == {(0, 0): h(1) + h(2)}
    assert await storage.log_entry_index(b.id) == 1
    assert await storage.log_entry_index("rcpt_nothing") is None
    assert [(i, r.id) for i, r in await storage.log_entry_receipts(0, 5)] == [(0, a.id), (1, b.id)]
    assert [(i, r.id) for i, r in await storage.log_entry_receipts(1, 2)] == [(1, b.id)]
    assert (await storage.tree_head()).size == 2
    assert await storage.unlogged_receipts(10) == []
    c = await settle()
    assert [r.id for r in await storage.unlogged_receipts(10)] == [c.id]


async def test_a_raced_integration_writes_nothing(storage, settle):
    a, b = await settle(), await settle()
    await storage.append_log_tiles(
        [LogEntry(leaf_index=0, receipt_id=a.id)], [tile(0, 0, 1)], head(1)
    )
    attempts = [
        # the same leaf index again (another process appended first)
        ([LogEntry(leaf_index=0, receipt_id=b.id)], [tile(0, 0, 1, 2)], head(2)),
        # the same receipt at another index
        ([LogEntry(leaf_index=1, receipt_id=a.id)], [tile(0, 0, 1, 2)], head(2)),
        # a size already signed
        ([LogEntry(leaf_index=1, receipt_id=b.id)], [tile(0, 0, 1, 2)], head(1)),
        # a tile that changes a hash it published
        ([LogEntry(leaf_index=1, receipt_id=b.id)], [tile(0, 0, 9, 2)], head(2)),
        # a tile that shrinks
        (
            [LogEntry(leaf_index=1, receipt_id=b.id)],
            [LogTile(level=0, index=0, hashes=b"")],
            head(2),
        ),
    ]
    for entries, tiles, signed in attempts:
        with pytest.raises(StateConflict):
            await storage.append_log_tiles(entries, tiles, signed)
        assert await storage.log_tiles([(0, 0)]) == {(0, 0): h(1)}
        assert await storage.log_entry_index(b.id) is None
        assert (await storage.tree_head()).size == 1
    # The same bytes again are no change (an interrupted tile build starts over).
    await storage.append_log_tiles([], [tile(0, 0, 1)], None)
    await storage.append_log_tiles(
        [LogEntry(leaf_index=1, receipt_id=b.id)], [tile(0, 0, 1, 2)], head(2)
    )
    assert await storage.log_tiles([(0, 0)]) == {(0, 0): h(1) + h(2)}


async def test_no_writer_can_rewrite_or_delete_the_log(storage, settle, tmp_path):
    a = await settle()
    await storage.append_log_tiles(
        [LogEntry(leaf_index=0, receipt_id=a.id)], [tile(0, 0, 1)], head(1)
    )
    db = sqlite3.connect(tmp_path / "gateway.db")
    for statement in (
        "UPDATE log_entries SET leaf_index = 5",
        "DELETE FROM log_entries",
        "UPDATE log_tiles SET hashes = zeroblob(32)",
        "DELETE FROM log_tiles",
        "INSERT INTO log_tiles VALUES (0, 1, zeroblob(31))",  # not whole hashes
        "INSERT INTO log_tiles VALUES (0, 1, zeroblob(8224))",  # more than 256
        "INSERT INTO log_entries VALUES (1, 'rcpt_never_issued')",
    ):
        with pytest.raises(sqlite3.IntegrityError):
            db.execute("PRAGMA foreign_keys = ON")
            db.execute(statement)
    db.close()
