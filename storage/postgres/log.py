"""The transparency log (LogPort) on PostgreSQL.

The transparency log is stored as C2SP tiles (migration 0004): entries, tiles and the
signed head of one integration are one transaction; a tile only grows (a trigger refuses
any other update), a reused leaf index, receipt or signed size fails a unique key, an
append that does not continue the latest signed head is refused (compare-and-set on the
tree size), and any of these is a StateConflict with nothing written. `log_pending`
holds exactly the receipts in neither log_leaves (old-format leaves) nor log_entries.
One process appends: the log's sequencer, which holds a session advisory lock on a
connection of its own (`claim_log_sequencer`).
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg  # type: ignore[import-untyped]  # ships no type information

from model_gateway.storage.errors import StateConflict
from model_gateway.storage.postgres.connection import Connection, PostgresBase, Row, _failure
from model_gateway.storage.postgres.rows import _fields, _receipt
from model_gateway.storage.records import LogEntry, LogLeaf, LogTile, ReceiptRecord, TreeHeadRecord

# The backend's one logger, as before its split into modules: model_gateway.storage.postgres.
log = logging.getLogger(__package__)

# pg_advisory_xact_lock key: one log appender at a time.
_LOG_LOCK = 0x6D67_6C67
# pg_try_advisory_lock key (session level): the transparency log's one sequencer.
_SEQUENCER_LOCK = 0x6D67_7371
# The server ends the sequencer's session after this long without a query (a hung
# holder: its lock goes with it); the holder queries it before every integration.
_SEQUENCER_IDLE = "5s"
_SEQUENCER_TIMEOUT_S = 2.0


def _leaf(row: Row) -> LogLeaf:
    return LogLeaf(**{**_fields(row, LogLeaf), "public_receipt": bytes(row["public_receipt"])})


def _tree_head(row: Row) -> TreeHeadRecord:
    return TreeHeadRecord(**_fields(row, TreeHeadRecord))


class PostgresLog(PostgresBase):
    """The transparency log."""

    async def unlogged_receipts(self, limit: int) -> list[ReceiptRecord]:
        # log_pending holds exactly the receipts in neither log_leaves nor log_entries
        # (their triggers take them out), in issue order.
        return await self._all(
            _receipt,
            "SELECT r.* FROM log_pending q JOIN receipts r ON r.id = q.receipt_id"
            " ORDER BY q.seq LIMIT $1",
            limit,
        )

    async def unlogged_receipt_ids(self, limit: int) -> list[tuple[str, int]]:
        return await self._all(
            lambda row: (row["receipt_id"], row["created_at"]),
            "SELECT q.receipt_id, r.created_at FROM log_pending q"
            " JOIN receipts r ON r.id = q.receipt_id ORDER BY q.seq LIMIT $1",
            limit,
        )

    async def skip_unloggable(self, receipt_ids: list[str]) -> None:
        # The queue would hold them forever, ahead of every follower's look.
        await self._run(
            lambda c: c.execute(
                "DELETE FROM log_pending WHERE receipt_id = ANY($1::text[])", receipt_ids
            )
        )

    async def log_leaves(self, start: int = 0, limit: int | None = None) -> list[LogLeaf]:
        return await self._all(
            _leaf,
            "SELECT leaf_index, receipt_id, public_receipt, signature FROM log_leaves"
            " WHERE leaf_index >= $1 ORDER BY leaf_index LIMIT $2",
            start,
            limit,
        )

    async def log_leaf(self, receipt_id: str) -> LogLeaf | None:
        return await self._one(
            _leaf,
            "SELECT leaf_index, receipt_id, public_receipt, signature FROM log_leaves"
            " WHERE receipt_id = $1",
            receipt_id,
        )

    async def append_log_tiles(
        self, entries: list[LogEntry], tiles: list[LogTile], head: TreeHeadRecord | None
    ) -> None:
        async def append(conn: Connection) -> None:
            async with conn.transaction():
                # One integrator at a time (no lock-order deadlock between tile upserts);
                # a writer that raced us then fails on the entries' keys, before the tiles.
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOG_LOCK)
                if head is not None:
                    # Compare-and-set on the tree size: a stale sequencer (one that paused
                    # and lost its lock) cannot fork the log or leave a gap in it.
                    stored = await conn.fetchval("SELECT coalesce(max(size), 0) FROM tree_heads")
                    if stored != head.size - len(entries):
                        raise StateConflict(
                            f"PostgreSQL append_log_tiles: the log is at size {stored},"
                            f" this append continues size {head.size - len(entries)}"
                        )
                await conn.execute(
                    "INSERT INTO log_entries (leaf_index, receipt_id)"
                    " SELECT * FROM unnest($1::bigint[], $2::text[])",
                    [e.leaf_index for e in entries],
                    [e.receipt_id for e in entries],
                )
                # The log_tiles_only_grow trigger refuses an update that is not an append.
                await conn.execute(
                    "INSERT INTO log_tiles (level, idx, hashes)"
                    " SELECT * FROM unnest($1::integer[], $2::bigint[], $3::bytea[])"
                    " ON CONFLICT (level, idx) DO UPDATE SET hashes = EXCLUDED.hashes",
                    [t.level for t in tiles],
                    [t.index for t in tiles],
                    [t.hashes for t in tiles],
                )
                if head is not None:
                    await conn.execute(
                        "INSERT INTO tree_heads (size, root_hash, timestamp, key_id, signature)"
                        " VALUES ($1, $2, $3, $4, $5)",
                        head.size,
                        head.root_hash,
                        head.timestamp,
                        head.key_id,
                        head.signature,
                    )

        await self._run(append)

    async def log_tiles(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        wanted = sorted(set(keys))
        rows = await self._run(
            lambda c: c.fetch(
                "SELECT t.level, t.idx, t.hashes FROM log_tiles t"
                " JOIN unnest($1::integer[], $2::bigint[]) AS k (level, idx)"
                " ON t.level = k.level AND t.idx = k.idx",
                [level for level, _ in wanted],
                [index for _, index in wanted],
            )
        )
        return {(row["level"], row["idx"]): bytes(row["hashes"]) for row in rows}

    async def log_entry_index(self, receipt_id: str) -> int | None:
        index = await self._run(
            lambda c: c.fetchval(
                "SELECT leaf_index FROM log_entries WHERE receipt_id = $1", receipt_id
            )
        )
        return None if index is None else int(index)

    async def log_entry_receipts(self, start: int, end: int) -> list[tuple[int, ReceiptRecord]]:
        return await self._all(
            lambda row: (int(row["log_leaf_index"]), _receipt(row)),
            "SELECT e.leaf_index AS log_leaf_index, r.* FROM log_entries e"
            " JOIN receipts r ON r.id = e.receipt_id"
            " WHERE e.leaf_index >= $1 AND e.leaf_index < $2 ORDER BY e.leaf_index",
            start,
            end,
        )

    async def tree_head(self, size: int | None = None) -> TreeHeadRecord | None:
        if size is None:
            return await self._one(
                _tree_head, "SELECT * FROM tree_heads ORDER BY size DESC LIMIT 1"
            )
        return await self._one(_tree_head, "SELECT * FROM tree_heads WHERE size = $1", size)

    # --- the log's sequencer -----------------------------------------------------------

    async def claim_log_sequencer(self) -> bool:
        """A session advisory lock, on a connection of its own: held while that session
        lives. It ends, and frees the lock, when the process dies (its socket closes) or
        hangs (the server ends a session idle for `_SEQUENCER_IDLE`; the holder queries it
        on every call). A lock rather than a lease row: a dead holder's lock is free at
        once, and no clock or expiry is involved. A call that fails drops the connection
        (and the lock with it): the next call starts a new session and tries again."""

        async def claim() -> None:
            if self._sequencer is None or self._sequencer.is_closed():
                self._sequencing = False
                self._sequencer = await asyncpg.connect(
                    self._dsn,
                    server_settings={
                        "application_name": "model-gateway-sequencer",
                        "idle_session_timeout": _SEQUENCER_IDLE,
                    },
                )
            if self._sequencing:  # the session is alive, so the lock is still ours
                await self._sequencer.fetchval("SELECT 1")
            else:
                self._sequencing = await self._sequencer.fetchval(
                    "SELECT pg_try_advisory_lock($1)", _SEQUENCER_LOCK
                )

        failure = await _failure(lambda: asyncio.wait_for(claim(), _SEQUENCER_TIMEOUT_S))
        if failure is not None:
            log.warning("log sequencer lock: %s; starting a new session", failure)
            self._drop_sequencer()
        return self._sequencing
