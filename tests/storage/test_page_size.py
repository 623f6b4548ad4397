"""Page size: a new SQLite database gets `PAGE_SIZE_BYTES` pages (fewer WAL bytes per
commit); a database created before keeps its own, and its requests are metered as ever.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from model_gateway.storage import ProjectRecord, ReservationRecord, open_storage
from model_gateway.storage import sqlite as sqlite_backend
from model_gateway.storage.base import KeyRecord

from .test_fewer_pages_migration import KEY, MONTH, PROJECT, _receipt


def _page_size(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


async def _hold_and_settle(path: Path, pairs: int = 1) -> tuple[int, int, float]:
    """A project, a key, a credit, then `pairs` holds each settled: balance and reserved
    at the end, and the WAL bytes a hold and its settlement wrote (no checkpoint here)."""
    storage = await open_storage(f"sqlite:///{path}")
    wal = Path(f"{path}-wal")
    try:
        await storage.create_project(ProjectRecord(id=PROJECT, name="p"))
        await storage.create_key(
            KeyRecord(
                id=KEY,
                prefix="proj_live_p",
                key_hash=b"h",
                project_id=PROJECT,
                scopes=frozenset({"inference"}),
            )
        )
        await storage.add_credit(PROJECT, 10_000, MONTH)
        start = wal.stat().st_size
        for n in range(pairs):
            hold = ReservationRecord(
                id=f"rsv_{n:024x}", project_id=PROJECT, key_id=KEY, amount=6, month=MONTH,
                owner="h:1:1", lease_until=9_999_999_999, created_at=1,
            )  # fmt: skip
            await storage.reserve(hold)
            assert await storage.settle(_receipt(n, hold.id, 2))
        account = await storage.project_account(PROJECT, MONTH)
        return account.balance, account.reserved, (wal.stat().st_size - start) / pairs
    finally:
        await storage.close()


def _older_database(path: Path) -> None:
    """An empty database with SQLite's default pages, as the gateway made them before."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("PRAGMA journal_mode = WAL")  # writes the header: the size is fixed now
    conn.close()


async def test_a_new_database_gets_the_smaller_pages(tmp_path):
    path = tmp_path / "new.db"
    assert (await _hold_and_settle(path))[:2] == (10_000 - 2, 0)
    assert sqlite_backend.PAGE_SIZE_BYTES == 2048
    assert _page_size(path) == sqlite_backend.PAGE_SIZE_BYTES


async def test_an_older_database_keeps_its_pages_and_works(tmp_path):
    path = tmp_path / "old.db"
    _older_database(path)
    assert (await _hold_and_settle(path))[:2] == (10_000 - 2, 0)
    assert _page_size(path) == 4096


async def test_a_request_writes_about_half_the_wal_bytes(tmp_path):
    # Measured: 49.9 KB with 4096-byte pages, 25.4 KB with 2048 (each commit alone).
    _older_database(tmp_path / "old.db")
    *_, old = await _hold_and_settle(tmp_path / "old.db", pairs=200)
    *_, new = await _hold_and_settle(tmp_path / "new.db", pairs=200)
    assert new <= 0.6 * old, (new, old)
