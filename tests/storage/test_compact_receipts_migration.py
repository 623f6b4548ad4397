"""Migration 0011 (compact receipts) on a database written at the schema before it.

The database is built by the real migrations 1-9 and filled with raw SQL the way the code
of that schema wrote it: v2 and v1 receipts, a sandbox receipt without key or provider,
ids and digests that are not of the gateway's own form, a hold settled in the month after
it was taken, log leaves of both kinds, credits and charges. After the migration every
receipt, ledger entry, log lookup and account reads back as it was, and the money rules
still hold on the new tables.
"""

from __future__ import annotations

import hashlib
import sqlite3

import msgspec
import orjson
import pytest

from model_gateway.storage import ReceiptRecord, ReservationRecord, open_storage
from model_gateway.storage import sqlite as sqlite_backend
from model_gateway.storage.base import LimitReached

PROJECT, KEY = "prj_00112233aabbccdd", "key_8899aabbccddeeff"
MONTH = "2026-10"
T0 = 1_792_000_000_000_000  # 2026-10-14, unix microseconds


def _hex(n: int, byte: int) -> str:
    return bytes([byte]).hex() * n


def _commitment(salt: str, response_sha256: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + bytes.fromhex(response_sha256)).hexdigest()


OLD_RECEIPTS = [
    # A v2 chat receipt as the gateway issues it.
    {
        "id": "rcpt_" + _hex(12, 0xA1), "reservation_id": "rsv_" + _hex(12, 0x01),
        "key_id": KEY, "request_id": "req_" + _hex(12, 0x11), "kind": "inference",
        "endpoint": "/v1/chat/completions", "model_or_runtime": "echo-1", "status": "succeeded",
        "usage": {"input_tokens": 12, "output_tokens": 34}, "cost": 51, "month": MONTH,
        "created_at": T0, "request_sha256": _hex(32, 0x21), "response_sha256": _hex(32, 0x22),
        "request_salt": _hex(16, 0x31), "response_salt": _hex(16, 0x32),
        "request_commitment": _hex(32, 0x41),
        "response_commitment": _commitment(_hex(16, 0x32), _hex(32, 0x22)),
        "usage_source": "provider", "provider": "echo",
    },
    # A v1 receipt (no salts, no commitments), failed, counted by the gateway.
    {
        "id": "rcpt_" + _hex(12, 0xA2), "reservation_id": "rsv_" + _hex(12, 0x02),
        "key_id": KEY, "request_id": "req_" + _hex(12, 0x12), "kind": "inference",
        "endpoint": "/v1/responses", "model_or_runtime": "echo-1", "status": "failed",
        "usage": {"input_tokens": 5, "output_tokens": 0}, "cost": 7, "month": MONTH,
        "created_at": T0 + 1, "request_sha256": _hex(32, 0x23), "response_sha256": _hex(32, 0x24),
        "request_salt": None, "response_salt": None, "request_commitment": None,
        "response_commitment": None, "usage_source": "gateway", "provider": None,
    },
    # A sandbox run without key, settled in the month after its hold, with a duration.
    {
        "id": "rcpt_" + _hex(12, 0xA3), "reservation_id": "rsv_" + _hex(12, 0x03),
        "key_id": None, "request_id": "req_" + _hex(12, 0x13), "kind": "sandbox",
        "endpoint": "/v1/sandbox/executions", "model_or_runtime": "python",
        "status": "cancelled", "usage": {"duration_ms": 1234}, "cost": 99, "month": "2026-09",
        "created_at": T0 + 2, "request_sha256": _hex(32, 0x25), "response_sha256": _hex(32, 0x26),
        "request_salt": _hex(16, 0x33), "response_salt": _hex(16, 0x34),
        "request_commitment": _hex(32, 0x42),
        "response_commitment": _commitment(_hex(16, 0x34), _hex(32, 0x26)),
        "usage_source": "provider", "provider": None,
    },
    # Ids and digests not of the gateway's form, a commitment that is not the rebuilt one,
    # a usage count that is not an integer: all kept as they were.
    {
        "id": "rcpt_odd-ID", "reservation_id": "hold-7", "key_id": KEY,
        "request_id": "req_ABC", "kind": "inference", "endpoint": "/v1/chat/completions",
        "model_or_runtime": "echo-1", "status": "succeeded",
        "usage": {"input_tokens": 1.5, "output_tokens": 2, "cached_tokens": 3}, "cost": 0,
        "month": MONTH, "created_at": T0 + 3, "request_sha256": "AB" * 32,
        "response_sha256": _hex(32, 0x27), "request_salt": "xyz", "response_salt": _hex(16, 0x35),
        "request_commitment": _hex(32, 0x43), "response_commitment": _hex(32, 0x44),
        "usage_source": "provider", "provider": "echo",
    },
]  # fmt: skip

COLUMNS = list(OLD_RECEIPTS[0])


def _old_database(path) -> None:
    """A database at user_version 9, written with raw SQL as the code of that schema did."""
    conn = sqlite3.connect(path, isolation_level=None)
    for number, script in sqlite_backend._migrations():
        if number > 9:
            break
        conn.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(
        "INSERT INTO projects (id, name, created_at) VALUES (?, 'old', ?)", (PROJECT, T0 // 10**6)
    )
    conn.execute(
        "INSERT INTO api_keys (id, prefix, key_hash, project_id, scopes, created_at)"
        " VALUES (?, 'proj_live_old', x'00', ?, '[\"inference\"]', 1)",
        (KEY, PROJECT),
    )
    conn.execute(
        "INSERT INTO ledger (project_id, kind, amount, month, created_at)"
        " VALUES (?, 'credit', 1000000, ?, 1)",
        (PROJECT, MONTH),
    )
    for r in OLD_RECEIPTS:
        conn.execute(
            "INSERT INTO reservations (id, project_id, key_id, amount, month, owner,"
            " lease_until, created_at) VALUES (?, ?, ?, 1000, ?, 'old:1:1', 9999999999, 1)",
            (r["reservation_id"], PROJECT, r["key_id"], r["month"]),
        )
        values = {**r, "project_id": PROJECT, "usage": orjson.dumps(r["usage"]).decode()}
        names = [*COLUMNS, "project_id"]
        conn.execute(
            f"INSERT INTO receipts ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",  # noqa: S608
            [values[n] for n in names],
        )
    # The first receipt logged before tiles, the second with them.
    conn.execute("INSERT INTO log_leaves VALUES (0, ?, x'7b7d', 'sig')", (OLD_RECEIPTS[0]["id"],))
    conn.execute("INSERT INTO log_entries VALUES (1, ?)", (OLD_RECEIPTS[1]["id"],))
    conn.close()


def _snapshot(path) -> dict[str, list[tuple[object, ...]]]:
    """What SQL readers see: receipts (a view after 0011), accounts and spend."""
    conn = sqlite3.connect(path)
    try:
        return {
            "receipts": conn.execute(
                f"SELECT {', '.join(COLUMNS)} FROM receipts ORDER BY created_at"  # noqa: S608
            ).fetchall(),
            "project": conn.execute("SELECT balance, reserved FROM projects").fetchall(),
            "spend": conn.execute("SELECT * FROM month_spend ORDER BY 1, 2").fetchall(),
        }
    finally:
        conn.close()


def _ledger(path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT id, kind, amount, key_id, receipt_id FROM ledger ORDER BY id"
        ).fetchall()
    finally:
        conn.close()


@pytest.fixture
async def migrated(tmp_path):
    path = tmp_path / "gateway.db"
    _old_database(path)
    before = {**_snapshot(path), "ledger": _ledger(path)}
    storage = await open_storage(f"sqlite:///{path}")
    yield storage, path, before
    await storage.close()


async def test_every_receipt_reads_back_as_it_was_written(migrated):
    storage, _, _ = migrated
    for old in OLD_RECEIPTS:
        expected = ReceiptRecord(**{**old, "project_id": PROJECT})
        assert await storage.get_receipt(old["id"]) == expected
    listed = [r for _, r in await storage.list_receipts(PROJECT, 10, None)]
    assert [r.id for r in listed] == [r["id"] for r in reversed(OLD_RECEIPTS)]
    page = await storage.list_receipts(PROJECT, 2, None)
    rest = await storage.list_receipts(PROJECT, 10, page[-1][0])
    assert [r.id for _, r in page + rest] == [r.id for r in listed]


async def test_ledger_accounts_and_log_read_back_as_they_were(migrated):
    storage, path, before = migrated
    after = _snapshot(path)
    assert after["project"] == before["project"] and after["spend"] == before["spend"]

    # The view shows the old columns (usage as JSON of the same counts), but for the
    # response commitments the storage rebuilds.
    def columns(row: tuple[object, ...]) -> dict[str, object]:
        named = dict(zip(COLUMNS, row, strict=True))
        return {**named, "usage": orjson.loads(named["usage"]), "response_commitment": None}

    assert [columns(r) for r in after["receipts"]] == [columns(r) for r in before["receipts"]]
    assert [r[COLUMNS.index("response_commitment")] for r in after["receipts"]] == [
        None, None, None, _hex(32, 0x44),
    ]  # fmt: skip
    entries = await storage.list_ledger(PROJECT, 10, None)
    assert [(e.id, e.kind, e.amount, e.key_id, e.receipt_id) for e in reversed(entries)] == [
        (row[0], row[1], row[2], row[3], row[4]) for row in before["ledger"]
    ]
    audit = await storage.audit(PROJECT, MONTH)
    assert audit.balance == audit.ledger_sum == 1_000_000 - sum(r["cost"] for r in OLD_RECEIPTS)
    assert audit.month_spend == audit.month_charges_sum
    assert (await storage.log_leaf(OLD_RECEIPTS[0]["id"])).leaf_index == 0
    assert await storage.log_entry_index(OLD_RECEIPTS[1]["id"]) == 1
    [(index, logged)] = await storage.log_entry_receipts(1, 2)
    assert index == 1 and logged.id == OLD_RECEIPTS[1]["id"]
    assert [r.id for r in await storage.unlogged_receipts(10)] == [
        r["id"] for r in OLD_RECEIPTS[2:]
    ]
    [listing] = await storage.list_keys(PROJECT)
    assert listing.last_used_at == (T0 + 3) // 10**6
    by_model = await storage.usage(PROJECT, T0, T0 + 10, "model")
    echo = next(row for row in by_model if row["group"] == "echo-1")
    assert (echo["input_tokens"], echo["output_tokens"]) == (12 + 5 + 1.5, 34 + 0 + 2)
    python = next(row for row in by_model if row["group"] == "python")
    assert python["sandbox_ms"] == 1234


async def test_new_receipts_are_stored_compactly_and_the_money_rules_hold(migrated):
    storage, path, _ = migrated
    hold = ReservationRecord(
        id="rsv_" + _hex(12, 0x09), project_id=PROJECT, key_id=KEY, amount=500,
        month=MONTH, owner="t:1:1", lease_until=2**40, created_at=1,
    )  # fmt: skip
    await storage.reserve(hold)
    receipt = ReceiptRecord(
        **{
            **OLD_RECEIPTS[0], "id": "rcpt_" + _hex(12, 0xB1), "reservation_id": hold.id,
            "project_id": PROJECT, "cost": 400, "created_at": T0 + 10,
        }
    )  # fmt: skip
    assert await storage.settle(receipt)
    assert not await storage.settle(receipt)  # the hold is consumed once
    assert await storage.get_receipt(receipt.id) == receipt
    await storage.add_credit(PROJECT, 5, MONTH)
    # Whole rows (credits) and rows told by their receipt (charges), newest first, by page.
    entries = await storage.list_ledger(PROJECT, 100, None)
    assert [e.kind for e in entries] == ["credit", "charge", "charge", "charge", "charge",
                                         "charge", "credit"]  # fmt: skip
    assert entries[1].receipt_id == receipt.id and entries[1].amount == 400
    paged, cursor = [], None
    while page := await storage.list_ledger(PROJECT, 2, cursor):
        paged, cursor = paged + page, page[-1].id
    assert paged == entries
    audit = await storage.audit(PROJECT, MONTH)
    assert audit.balance == audit.ledger_sum and audit.month_spend == audit.month_charges_sum
    with pytest.raises(sqlite3.IntegrityError, match="reservation_gone"):  # any writer
        conn = sqlite3.connect(path)
        with conn:
            conn.execute(
                "INSERT INTO receipt_rows (id, reservation_id, project_id, request_id, shape,"
                " cost, created_at, request_sha256, response_sha256)"
                " VALUES (x'01', 'rsv_gone', ?, 'r', 1, 1, 1, 'a', 'b')",
                (PROJECT,),
            )
    conn.close()
    conn = sqlite3.connect(path)
    slim = conn.execute("SELECT count(*) FROM ledger WHERE receipt IS NOT NULL").fetchone()
    assert slim == (5,)  # the four migrated charges and the new one
    row = conn.execute(
        "SELECT typeof(id), length(id), typeof(request_sha256), month, response_commitment,"
        " usage_rest FROM receipt_rows WHERE id = ?",
        (bytes.fromhex(_hex(12, 0xB1)),),
    ).fetchone()
    conn.close()
    assert row == ("blob", 12, "blob", None, None, None)
    with pytest.raises(LimitReached):
        await storage.reserve(msgspec.structs.replace(hold, id="rsv_x", amount=10**9))
