"""Migration 0013 (fewer pages per request) on a database written at the schema before it.

The database is built by the real migrations 1-12 and holds what a running gateway leaves:
credits and charges in the ledger, open holds, a lease, a key with a monthly limit. After
the migration every row reads back as it was, ledger ids keep counting from the largest,
the triggers that went with the rebuilt tables work again, and a request's two commits
write the pages the migration's header says.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest

from model_gateway.storage import ReceiptRecord, ReservationRecord, open_storage
from model_gateway.storage import sqlite as sqlite_backend
from model_gateway.storage.base import LimitReached

PROJECT, KEY = "prj_00112233aabbccdd", "key_8899aabbccddeeff"
MONTH = "2026-11"
T0 = 1_795_000_000_000_000  # 2026-11-19, unix microseconds
WAL_FRAME = 24 + 4096


def _schema_12(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.create_function("gateway_pack", 2, sqlite_backend._pack, deterministic=True)
    conn.create_function("gateway_usage", 2, sqlite_backend._usage_part, deterministic=True)
    conn.create_function(
        "gateway_response_commitment", 2, sqlite_backend._response_commitment, deterministic=True
    )
    for number, script in sqlite_backend._migrations():
        if number > 12:
            break
        conn.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("INSERT INTO projects (id, name, created_at) VALUES (?, 'p', 1)", (PROJECT,))
    conn.execute(
        "INSERT INTO api_keys (id, prefix, key_hash, project_id, scopes, monthly_limit,"
        " created_at) VALUES (?, 'proj_live_p', x'00', ?, '[\"inference\"]', 50000, 1)",
        (KEY, PROJECT),
    )
    for amount in (100_000, 20_000):
        conn.execute(
            "INSERT INTO ledger (project_id, kind, amount, month, created_at)"
            " VALUES (?, 'credit', ?, ?, 1)",
            (PROJECT, amount, MONTH),
        )
    for n, (amount, lease) in enumerate([(600, 0), (700, 0), (5000, 1)]):
        conn.execute(
            "INSERT INTO reservations (id, project_id, key_id, amount, month, owner,"
            " lease_until, created_at, lease) VALUES (?, ?, ?, ?, ?, 'h:1:1', 9999999999, 1, ?)",
            (f"rsv_{n:024x}", PROJECT, KEY, amount, MONTH, lease),
        )
    conn.close()


# The columns of 0012 (later migrations add columns of their own: 0014's in_use, 0017's
# tpm).
_COLUMNS_AT_12 = {
    "reservations": "id, project_id, key_id, amount, month, owner, lease_until, created_at,"
    " lease, recalled",
    "ledger": "*",
    "projects": "id, name, state, monthly_budget, rpm, allow_models, exclude_models,"
    " created_at, balance, reserved, leased",
    "api_keys": "id, prefix, key_hash, project_id, scopes, models, monthly_limit, expires_at,"
    " rpm, state, created_at, reserved, name, last_used_us, leased",
    "month_spend": "*",
}


def _rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        return {
            table: conn.execute(f"SELECT {columns} FROM {table} ORDER BY 1, 2").fetchall()  # noqa: S608
            for table, columns in _COLUMNS_AT_12.items()
        }
    finally:
        conn.close()


@pytest.fixture
async def migrated(tmp_path):
    path = tmp_path / "gateway.db"
    _schema_12(path)
    before = _rows(path)
    storage = await open_storage(f"sqlite:///{path}")
    yield storage, path, before
    await storage.close()


def _receipt(n: int, reservation_id: str, cost: int) -> ReceiptRecord:
    return ReceiptRecord(
        id=f"rcpt_{n:024x}", reservation_id=reservation_id, project_id=PROJECT, key_id=KEY,
        request_id=f"req_{n:024x}", kind="inference", endpoint="/v1/chat/completions",
        model_or_runtime="echo-1", status="succeeded", usage={"input_tokens": 1}, cost=cost,
        month=MONTH, created_at=T0 + n, request_sha256="ab" * 32, response_sha256="cd" * 32,
        usage_source="provider", provider="echo",
    )  # fmt: skip


async def test_every_row_reads_back_and_the_tables_are_rebuilt(migrated):
    _, path, before = migrated
    assert _rows(path) == before
    conn = sqlite3.connect(path)
    try:
        tables = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
        assert tables["reservations"].rstrip().endswith("WITHOUT ROWID")
        assert "AUTOINCREMENT" not in tables["ledger"]
        assert conn.execute("SELECT * FROM sqlite_sequence WHERE name = 'ledger'").fetchall() == []
        indexes = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        assert "reservations_owner" not in indexes
        assert {"reservations_leases", "ledger_project", "ledger_receipt"} <= indexes
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("DELETE FROM ledger WHERE id = 2")
    finally:
        conn.close()


async def test_the_money_triggers_work_on_the_rebuilt_tables(migrated):
    storage, _, before = migrated
    last_ledger_id = max(row[0] for row in before["ledger"])
    # A hold settles (deleted, charged, ledger row numbered after the largest id).
    assert await storage.settle(_receipt(1, f"rsv_{0:024x}", 400))
    [charge, *_] = await storage.list_ledger(PROJECT, 10, None)
    assert (charge.id, charge.kind, charge.amount) == (last_ledger_id + 1, "charge", 400)
    # A receipt against the lease takes its cost out of it.
    assert await storage.settle(_receipt(2, f"rsv_{2:024x}", 1000))
    assert await storage.lease_audit(PROJECT) == (4000, 4000)
    # A release frees the hold; the admission trigger still counts the key's limit.
    await storage.release(f"rsv_{1:024x}")
    audit = await storage.audit(PROJECT, MONTH)
    assert audit.reserved == audit.open_reservations_sum == 4000
    assert audit.balance == audit.ledger_sum == 120_000 - 1400
    assert audit.month_spend == audit.month_charges_sum == 1400
    hold = ReservationRecord(
        id="rsv_big", project_id=PROJECT, key_id=KEY, amount=50_000 - 1400 - 4000 + 1,
        month=MONTH, owner="h:1:1", lease_until=2**40, created_at=1,
    )  # fmt: skip
    with pytest.raises(LimitReached):
        await storage.reserve(hold)
    await storage.reserve(msgspec.structs.replace(hold, amount=hold.amount - 1))
    # The owner's holds are still found without their index: renewal and the sweeper.
    await storage.renew_leases("h:1:1", 5)
    assert await storage.release_abandoned(lambda owner: None) == 2  # both lapsed at t=5 s


async def test_a_hold_and_a_settlement_write_the_pages_the_header_says(migrated):
    storage, path, _ = migrated
    wal = Path(f"{path}-wal")  # grows by a frame per page written (no checkpoint here)
    pages = {"hold": 0, "receipt": 0}
    n = 200
    for i in range(n):
        start = wal.stat().st_size
        hold = ReservationRecord(
            id=f"rsv_p{i:08d}", project_id=PROJECT, key_id=KEY, amount=10, month=MONTH,
            owner="h:1:1", lease_until=2**40, created_at=1,
        )  # fmt: skip
        await storage.reserve(hold)
        held = wal.stat().st_size
        assert await storage.settle(_receipt(100 + i, f"rsv_p{i:08d}", 5))
        pages["hold"] += (held - start) // WAL_FRAME
        pages["receipt"] += (wal.stat().st_size - held) // WAL_FRAME
    # 0012's schema wrote 5 and about 12.3; page splits add a page now and then.
    assert pages["hold"] / n <= 3.2
    assert pages["receipt"] / n <= 9.6
