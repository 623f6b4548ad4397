"""The transparency log (LogPort) on SQLite: the receipts waiting for it, its leaves,
tiles and signed heads (one group-committed unit per integration), and its sequencer's
lock, a lock file."""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

import orjson

from model_gateway.storage._batch import pack as _pack
from model_gateway.storage.records import LogEntry, LogLeaf, LogTile, ReceiptRecord, TreeHeadRecord
from model_gateway.storage.sqlite.connection import _GLANCE_ROWS, SQLiteBase
from model_gateway.storage.sqlite.rows import _receipt


def _try_lock(path: Path) -> int | None:
    """An exclusive flock on `path`, held by the returned descriptor; None if another holds
    it. One holder among every handle of every process on the file (the log's sequencer:
    gateway serve and its log process), and the kernel frees it when its holder's process
    dies, however it dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class SQLiteLog(SQLiteBase):
    """The transparency log."""

    async def unlogged_receipts(self, limit: int) -> list[ReceiptRecord]:
        # Whole receipts (read back after a restart, or settled by another process): rows
        # too long for the loop, on the thread.
        return [_receipt(row) for row in await self._unlogged("v.*", limit, self._fetchall)]

    async def unlogged_receipt_ids(self, limit: int) -> list[tuple[str, int]]:
        # Read several times a second: on the loop, unless the list is long (receipts the
        # log had to skip).
        fetch = self._glance if limit <= _GLANCE_ROWS else self._fetchall
        rows = await self._unlogged("v.id, v.created_at", limit, fetch)
        return [(row[0], row[1]) for row in rows]

    async def skip_unloggable(self, receipt_ids: list[str]) -> None:
        """Nothing to write: unlogged receipts are those after the last logged one, so the
        next receipt logged passes them."""

    async def _unlogged(
        self,
        columns: Literal["v.*", "v.id, v.created_at"],
        limit: int,
        fetch: Callable[[str, tuple[object, ...]], Awaitable[list[sqlite3.Row]]],
    ) -> list[sqlite3.Row]:
        # Leaves follow receipts' issue order, so the search starts after the last logged
        # one (with tiles, else before them) instead of scanning every receipt ever issued.
        last_leaf = await self._glance(
            "SELECT receipt_id FROM log_leaves ORDER BY leaf_index DESC LIMIT 1"
        )
        return await fetch(
            f"SELECT {columns} FROM receipt_rows r JOIN receipts v ON v.seq = r.seq"  # noqa: S608
            " WHERE r.seq > max("
            "  COALESCE((SELECT receipt FROM log_entries ORDER BY leaf_index DESC LIMIT 1), 0),"
            "  COALESCE((SELECT seq FROM receipt_rows WHERE id = ?), 0))"
            " AND NOT EXISTS (SELECT 1 FROM log_entries e WHERE e.receipt = r.seq)"
            " AND NOT EXISTS (SELECT 1 FROM log_leaves l WHERE l.receipt_id = v.id)"
            " ORDER BY r.seq LIMIT ?",
            (_pack("rcpt_", last_leaf[0][0]) if last_leaf else None, limit),
        )

    async def log_leaves(self, start: int = 0, limit: int | None = None) -> list[LogLeaf]:
        rows = await self._fetchall(
            "SELECT * FROM log_leaves WHERE leaf_index >= ? ORDER BY leaf_index LIMIT ?",
            (start, -1 if limit is None else limit),
        )
        return [
            LogLeaf(**{**dict(row), "public_receipt": bytes(row["public_receipt"])}) for row in rows
        ]

    async def log_leaf(self, receipt_id: str) -> LogLeaf | None:
        row = await self._fetchone("SELECT * FROM log_leaves WHERE receipt_id = ?", (receipt_id,))
        if row is None:
            return None
        return LogLeaf(**{**dict(row), "public_receipt": bytes(row["public_receipt"])})

    async def tree_head(self, size: int | None = None) -> TreeHeadRecord | None:
        if size is None:
            rows = await self._glance("SELECT * FROM tree_heads ORDER BY size DESC LIMIT 1")
        else:
            rows = await self._glance("SELECT * FROM tree_heads WHERE size = ?", (size,))
        return TreeHeadRecord(**dict(rows[0])) if rows else None

    async def append_log_tiles(
        self, entries: list[LogEntry], tiles: list[LogTile], head: TreeHeadRecord | None
    ) -> None:
        heads = [] if head is None else [head]
        head_rows: list[tuple[object, ...]] = [
            (h.size, h.size - len(entries), h.root_hash, h.timestamp, h.key_id, h.signature)
            for h in heads
        ]
        await self._writer.execute_unit(
            [
                # Entries first: a writer that raced us fails here, before the tiles.
                (
                    "INSERT INTO log_entries (leaf_index, receipt)"
                    " VALUES (?, (SELECT seq FROM receipt_rows WHERE id = ?))",
                    [(e.leaf_index, _pack("rcpt_", e.receipt_id)) for e in entries],
                ),
                # The log_tiles_only_grow trigger refuses an update that is not an append.
                (
                    "INSERT INTO log_tiles (level, idx, hashes) VALUES (?, ?, ?)"
                    " ON CONFLICT (level, idx) DO UPDATE SET hashes = excluded.hashes",
                    [(t.level, t.index, t.hashes) for t in tiles],
                ),
                # Compare-and-set on the tree size: unless the latest stored head is the
                # one this append continues, the root is NULL and NOT NULL undoes the unit.
                (
                    "INSERT INTO tree_heads (size, root_hash, timestamp, key_id, signature)"
                    " VALUES (?1, CASE WHEN (SELECT coalesce(max(size), 0) FROM tree_heads)"
                    " = ?2 THEN ?3 END, ?4, ?5, ?6)",
                    head_rows,
                ),
            ]
        )

    async def claim_log_sequencer(self) -> bool:
        if self._sequencer_lock is None:
            self._sequencer_lock = _try_lock(self._path.with_name(self._path.name + ".sequencer"))
        return self._sequencer_lock is not None

    async def log_tiles(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        # One round trip for every tile a proof needs, the keys as one JSON parameter.
        rows = await self._fetchall(
            "SELECT level, idx, hashes FROM log_tiles WHERE (level, idx) IN"
            " (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')"
            "  FROM json_each(?))",
            (orjson.dumps(sorted(set(keys))).decode(),),
        )
        return {(row[0], row[1]): bytes(row[2]) for row in rows}

    async def log_entry_index(self, receipt_id: str) -> int | None:
        row = await self._fetchone(
            "SELECT e.leaf_index FROM receipt_rows r JOIN log_entries e ON e.receipt = r.seq"
            " WHERE r.id = ?",
            (_pack("rcpt_", receipt_id),),
        )
        return None if row is None else row[0]

    async def log_entry_receipts(self, start: int, end: int) -> list[tuple[int, ReceiptRecord]]:
        rows = await self._fetchall(
            "SELECT e.leaf_index AS log_leaf_index, v.* FROM log_entries e"
            " JOIN receipts v ON v.seq = e.receipt"
            " WHERE e.leaf_index >= ? AND e.leaf_index < ? ORDER BY e.leaf_index",
            (start, end),
        )
        return [(row["log_leaf_index"], _receipt(row)) for row in rows]
