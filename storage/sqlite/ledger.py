"""Holds, settlements and receipts, leases, credits, payments, purchases and payer
addresses (LedgerPort) on SQLite. The money moves in triggers; every write of the request
path is one group-committed statement."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import aiosqlite
import orjson

from model_gateway.storage._batch import pack as _pack
from model_gateway.storage.errors import PayerAddressTaken, RecordNotFound, StateConflict
from model_gateway.storage.records import (
    Account,
    Audit,
    AuditEntry,
    LedgerEntry,
    PaymentRecord,
    PurchaseRecord,
    ReceiptRecord,
    ReservationRecord,
    account,
    ledger_entry,
    now_s,
)
from model_gateway.storage.sqlite.audit import SQLiteAudit
from model_gateway.storage.sqlite.rows import (
    _month_of,
    _receipt,
    _response_commitment,
    _split_prices,
    _split_usage,
    _unpack,
)

_MAX_INT = 2**63 - 1
# The usage report's sums of the classes within input and output (none: 0), and what a
# receipt's cache reads saved against its input price, in micro-units x 10^6 (NULL for
# receipts without the prices applied: those before prices by class).
_CLASS_SUMS = ", ".join(
    f"COALESCE(SUM(json_extract(r.usage_rest, '$.{name}')), 0) AS {name}"
    for name in ("cached_input_tokens", "cache_write_tokens", "reasoning_tokens")
)
_SAVED = (
    "(json_extract(r.usage_rest, '$.cached_input_tokens')"
    " * (json_extract(s.prices, '$.input_price_per_mtok')"
    "  - json_extract(s.prices, '$.cached_input_price_per_mtok')))"
)


def _usage_sums(row: sqlite3.Row) -> dict[str, object]:
    """A group of the usage report; its cache savings rounded down to the micro-unit once
    (SQLite's division truncates: the remainders keep the exact sum, Python floors it)."""
    sums: dict[str, Any] = {**dict(row), "group": row["grp"]}
    sums["cache_savings"] = sums.pop("saved_micros") + sums.pop("saved_rest") // 1_000_000
    return sums


class SQLiteLedger(SQLiteAudit):
    """The money."""

    async def add_credit(
        self, project_id: str, amount: int, month: str, audit: AuditEntry | None = None
    ) -> None:
        if await self.get_project(project_id) is None:
            raise RecordNotFound(f"no project {project_id}")
        await self._write_audited(
            "INSERT INTO ledger (project_id, kind, amount, month, created_at)"
            " VALUES (?, 'credit', ?, ?, ?)",
            (project_id, amount, month, now_s()),
            audit,
        )

    async def reserve(self, reservation: ReservationRecord) -> None:
        r = reservation
        await self._write(
            "INSERT INTO reservations (id, project_id, key_id, amount, month, owner, lease_until,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (r.id, r.project_id, r.key_id, r.amount, r.month, r.owner, r.lease_until, r.created_at),
        )

    async def settle(self, receipt: ReceiptRecord) -> bool:
        r = receipt
        counts, prices = _split_prices(r.usage)
        labels = (
            r.kind,
            r.endpoint,
            r.model_or_runtime,
            r.status,
            r.usage_source,
            r.provider,
            prices,
        )
        await self._add_shape(labels)
        input_tokens, output_tokens, usage_rest = _split_usage(counts)
        rebuilt = _response_commitment(r.response_salt, r.response_sha256)
        # Inserted only while its hold is open and covers the cost, in the one statement:
        # no row (False) when the hold is gone. The `receipt_needs_hold` trigger enforces
        # the same rule for every other writer (it aborts with reservation_gone).
        inserted = await self._write(
            "INSERT INTO receipt_rows (id, reservation_id, project_id, key_id, request_id,"
            " shape, input_tokens, output_tokens, usage_rest, cost, month, created_at,"
            " request_sha256, response_sha256, request_salt, response_salt,"
            " request_commitment, response_commitment)"
            " SELECT ?, ?, ?, ?, ?, s.id, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
            " FROM receipt_shapes s WHERE s.kind = ? AND s.endpoint = ?"
            " AND s.model_or_runtime = ? AND s.status = ? AND s.usage_source = ?"
            " AND s.provider IS ? AND s.prices IS ?"
            " AND EXISTS (SELECT 1 FROM reservations"
            "  WHERE id = ? AND project_id = ? AND amount >= ?)",
            (
                _pack("rcpt_", r.id),
                _pack("rsv_", r.reservation_id),
                _pack("prj_", r.project_id),
                _pack("key_", r.key_id),
                _pack("req_", r.request_id),
                input_tokens,
                output_tokens,
                usage_rest,
                r.cost,
                None if r.month == _month_of(r.created_at) else r.month,
                r.created_at,
                _pack("", r.request_sha256),
                _pack("", r.response_sha256),
                _pack("", r.request_salt),
                _pack("", r.response_salt),
                _pack("", r.request_commitment),
                None if r.response_commitment == rebuilt else _pack("", r.response_commitment),
                *labels,
                r.reservation_id,
                r.project_id,
                r.cost,
            ),
        )
        return inserted == 1

    async def _add_shape(self, labels: tuple[str | None, ...]) -> None:
        """The receipt's labels in receipt_shapes, the first time this process meets them
        (a write SQL decides alone: group-committed, before the receipt that needs them)."""
        if labels not in self._shapes:
            await self._write(
                "INSERT INTO receipt_shapes (kind, endpoint, model_or_runtime, status,"
                " usage_source, provider, prices) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                labels,
            )
            self._shapes.add(labels)

    async def release(self, reservation_id: str) -> None:
        await self._write("DELETE FROM reservations WHERE id = ?", (reservation_id,))

    async def renew_leases(self, owner: str, lease_until: int) -> None:
        await self._write(
            "UPDATE reservations SET lease_until = ? WHERE owner = ?", (lease_until, owner)
        )

    async def release_abandoned(self, owner_alive: Callable[[str], bool | None]) -> int:
        rows = await self._fetchall("SELECT DISTINCT owner FROM reservations")
        released = await self._write("DELETE FROM reservations WHERE lease_until < ?", (now_s(),))
        for row in rows:
            if owner_alive(row["owner"]) is False:
                released += await self._write(
                    "DELETE FROM reservations WHERE owner = ?", (row["owner"],)
                )
        return released

    async def project_account(self, project_id: str, month: str) -> Account:
        row = await self._fetchone(
            "SELECT p.balance, p.reserved, p.leased, COALESCE(m.spent, 0) AS spent,"
            " (SELECT COALESCE(SUM(min(in_use, amount)), 0) FROM reservations"
            "  WHERE project_id = p.id AND lease = 1) AS in_use"
            " FROM projects p"
            " LEFT JOIN month_spend m ON m.subject = p.id AND m.month = ? WHERE p.id = ?",
            (month, project_id),
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return account(row)

    async def key_month_spend(self, key_id: str, month: str) -> int:
        row = await self._fetchone(
            "SELECT spent FROM month_spend WHERE subject = ? AND month = ?", (key_id, month)
        )
        return 0 if row is None else int(row["spent"])

    async def audit(self, project_id: str, month: str) -> Audit:
        # Charges are whole ledger rows, or rows that name their receipt (migration 0011).
        row = await self._fetchone(
            "SELECT p.balance, p.reserved,"
            " (SELECT COALESCE(SUM(CASE kind WHEN 'credit' THEN amount ELSE -amount END), 0)"
            "  FROM ledger WHERE project_id = p.id)"
            " - (SELECT COALESCE(SUM(r.cost), 0) FROM receipt_rows r"
            "  JOIN ledger l ON l.receipt = r.seq WHERE r.project_id = ?1) AS ledger_sum,"
            " (SELECT COALESCE(SUM(amount), 0) FROM reservations WHERE project_id = p.id) AS held,"
            " (SELECT COALESCE(SUM(spent), 0) FROM month_spend WHERE subject = p.id AND month = ?2)"
            "  AS month_spend,"
            " (SELECT COALESCE(SUM(amount), 0) FROM ledger"
            "  WHERE project_id = p.id AND kind = 'charge' AND month = ?2)"
            " + (SELECT COALESCE(SUM(r.cost), 0) FROM receipt_rows r"
            "  JOIN ledger l ON l.receipt = r.seq WHERE r.project_id = ?1 AND ?2 ="
            "  coalesce(r.month, strftime('%Y-%m', r.created_at / 1000000, 'unixepoch')))"
            "  AS month_charges"
            " FROM projects p WHERE p.id = ?3",
            (_pack("prj_", project_id), month, project_id),
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return Audit(
            balance=row["balance"],
            ledger_sum=row["ledger_sum"],
            reserved=row["reserved"],
            open_reservations_sum=row["held"],
            month_spend=row["month_spend"],
            month_charges_sum=row["month_charges"],
        )

    async def limit_figures(
        self, project_id: str, key_id: str | None, month: str
    ) -> dict[str, int | None]:
        row = await self._fetchone(
            "SELECT p.balance, p.reserved, p.monthly_budget,"
            " COALESCE((SELECT spent FROM month_spend WHERE subject = p.id AND month = ?), 0)"
            "  AS month_spend,"
            " k.monthly_limit AS key_monthly_limit, k.reserved AS key_reserved,"
            " COALESCE((SELECT spent FROM month_spend WHERE subject = k.id AND month = ?), 0)"
            "  AS key_month_spend"
            " FROM projects p LEFT JOIN api_keys k ON k.id = ? WHERE p.id = ?",
            (month, month, key_id, project_id),
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return dict(row)

    async def get_receipt(self, receipt_id: str) -> ReceiptRecord | None:
        row = await self._fetchone(
            "SELECT * FROM receipts WHERE seq = (SELECT seq FROM receipt_rows WHERE id = ?)",
            (_pack("rcpt_", receipt_id),),
        )
        return None if row is None else _receipt(row)

    async def list_receipts(
        self, project_id: str, limit: int, before: int | None
    ) -> list[tuple[int, ReceiptRecord]]:
        rows = await self._fetchall(
            "SELECT v.* FROM receipt_rows r JOIN receipts v ON v.seq = r.seq"
            " WHERE r.project_id = ? AND r.seq < ? ORDER BY r.seq DESC LIMIT ?",
            (_pack("prj_", project_id), _MAX_INT if before is None else before, limit),
        )
        return [(row["seq"], _receipt(row)) for row in rows]

    async def usage(
        self, project_id: str, start_us: int, end_us: int, group_by: str
    ) -> list[dict[str, object]]:
        group = {
            "day": "strftime('%Y-%m-%d', r.created_at / 1000000, 'unixepoch')",
            "model": "s.model_or_runtime",
            "key": "k.prefix",
        }[group_by]
        # Receipts (migration 0011) keep integer token counts in columns, others in usage_rest.
        # Cache savings are summed as whole micro-units and remainders (a sum of products
        # could pass 64 bits), so that each group is rounded down once (_usage_sums).
        rows = await self._fetchall(
            f"SELECT {group} AS grp, COUNT(*) AS requests,"  # noqa: S608 (fixed expressions)
            " COALESCE(SUM(COALESCE(r.input_tokens,"
            "  json_extract(r.usage_rest, '$.input_tokens'))), 0) AS input_tokens,"
            " COALESCE(SUM(COALESCE(r.output_tokens,"
            "  json_extract(r.usage_rest, '$.output_tokens'))), 0) AS output_tokens,"
            f" {_CLASS_SUMS},"
            f" COALESCE(SUM({_SAVED} / 1000000), 0) AS saved_micros,"
            f" COALESCE(SUM({_SAVED} % 1000000), 0) AS saved_rest,"
            " COALESCE(SUM(CASE s.kind WHEN 'sandbox'"
            "  THEN json_extract(r.usage_rest, '$.duration_ms') END), 0) AS sandbox_ms,"
            " SUM(r.cost) AS cost"
            " FROM receipt_rows r JOIN receipt_shapes s ON s.id = r.shape"
            " LEFT JOIN api_keys k ON k.id = (CASE typeof(r.key_id) WHEN 'blob'"
            "  THEN 'key_' || lower(hex(r.key_id)) ELSE r.key_id END)"
            " WHERE r.project_id = ? AND r.created_at >= ? AND r.created_at < ?"
            " GROUP BY grp ORDER BY grp",
            (_pack("prj_", project_id), start_us, end_us),
        )
        return [_usage_sums(row) for row in rows]

    async def list_ledger(
        self, project_id: str, limit: int, before: int | None
    ) -> list[LedgerEntry]:
        below = _MAX_INT if before is None else before
        whole = await self._fetchall(
            "SELECT l.id, l.kind, l.amount, l.key_id, l.receipt_id, l.created_at,"
            " p.reference, u.tx_hash FROM ledger l"
            " LEFT JOIN payments p ON p.ledger_id = l.id"
            " LEFT JOIN purchases u ON u.ledger_id = l.id"
            " WHERE l.project_id = ? AND l.id < ? ORDER BY l.id DESC LIMIT ?",
            (project_id, below, limit),
        )
        # Charges told by their receipt (migration 0011), found along the receipts' project
        # index: their ledger ids grow with their receipts' seqs, so those below the cursor
        # are the receipts below the first such charge at or above it.
        told = await self._fetchall(
            "SELECT l.id, 'charge' AS kind, r.cost AS amount, r.key_id, r.id AS receipt_id,"
            " r.created_at / 1000000 AS created_at, NULL AS reference, NULL AS tx_hash"
            " FROM receipt_rows r JOIN ledger l ON l.receipt = r.seq"
            " WHERE r.project_id = ? AND r.seq < COALESCE((SELECT receipt FROM ledger"
            "  WHERE id >= ? AND receipt IS NOT NULL ORDER BY id LIMIT 1), ?)"
            " ORDER BY r.seq DESC LIMIT ?",
            (_pack("prj_", project_id), below, _MAX_INT, limit),
        )
        rows = sorted([*whole, *told], key=lambda row: row["id"], reverse=True)[:limit]
        return [ledger_entry(row, _unpack) for row in rows]

    @staticmethod
    async def _credit_once(
        db: aiosqlite.Connection,
        project_id: str,
        amount: int,
        month: str,
        created_at: int,
        seen: tuple[str, tuple[object, ...]],
        conflict: str,
    ) -> int:
        """A credit entry for money that arrived once (a payment, a purchase), inside the
        caller's transaction; StateConflict when the `seen` query finds it recorded."""
        found = await (
            await db.execute("SELECT 1 FROM projects WHERE id = ?", (project_id,))
        ).fetchone()
        if found is None:
            raise RecordNotFound(f"no project {project_id}")
        if await (await db.execute(*seen)).fetchone() is not None:
            raise StateConflict(conflict)
        cursor = await db.execute(
            "INSERT INTO ledger (project_id, kind, amount, month, created_at)"
            " VALUES (?, 'credit', ?, ?, ?)",
            (project_id, amount, month, created_at),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    async def record_payment(
        self, payment: PaymentRecord, audit: AuditEntry | None = None
    ) -> PaymentRecord:
        p = payment
        async with self._transaction() as db:
            ledger_id = await self._credit_once(
                db,
                p.project_id,
                p.amount,
                p.month,
                p.created_at,
                (
                    "SELECT 1 FROM payments WHERE project_id = ? AND reference = ?",
                    (p.project_id, p.reference),
                ),
                f"payment {p.reference!r} is already recorded",
            )
            await db.execute(
                "INSERT INTO payments (id, project_id, reference, amount, ledger_id, recorded_by,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    p.id,
                    p.project_id,
                    p.reference,
                    p.amount,
                    ledger_id,
                    p.recorded_by,
                    p.created_at,
                ),
            )
            await self._record(db, audit)
        return payment

    async def get_purchase(self, tx_hash: str) -> PurchaseRecord | None:
        row = await self._fetchone(
            "SELECT u.*, l.month FROM purchases u JOIN ledger l ON l.id = u.ledger_id"
            " WHERE u.tx_hash = ?",
            (tx_hash,),
        )
        if row is None:
            return None
        fields = {name: row[name] for name in PurchaseRecord.__struct_fields__}
        return PurchaseRecord(**{**fields, "token_units": int(row["token_units"])})

    async def record_purchase(
        self, purchase: PurchaseRecord, audit: AuditEntry | None = None
    ) -> PurchaseRecord:
        p = purchase
        async with self._transaction() as db:
            ledger_id = await self._credit_once(
                db,
                p.project_id,
                p.amount,
                p.month,
                p.created_at,
                ("SELECT 1 FROM purchases WHERE tx_hash = ?", (p.tx_hash,)),
                f"transaction {p.tx_hash} is already credited",
            )
            await db.execute(
                "INSERT INTO purchases (tx_hash, project_id, sender, token_units, amount,"
                " ledger_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    p.tx_hash,
                    p.project_id,
                    p.sender,
                    str(p.token_units),
                    p.amount,
                    ledger_id,
                    p.created_at,
                ),
            )
            await self._record(db, audit)
        return purchase

    async def payer_addresses(self, project_id: str) -> list[str]:
        rows = await self._fetchall(
            "SELECT address FROM payer_addresses WHERE project_id = ? ORDER BY address",
            (project_id,),
        )
        return [row["address"] for row in rows]

    async def set_payer_addresses(
        self, project_id: str, addresses: list[str], audit: AuditEntry | None = None
    ) -> None:
        async with self._transaction() as db:
            row = await (
                await db.execute("SELECT state FROM projects WHERE id = ?", (project_id,))
            ).fetchone()
            if row is None:
                raise RecordNotFound(f"no project {project_id}")
            if row["state"] != "active":
                raise StateConflict(f"project {project_id} is archived")
            # Checked here for a clear refusal; the unique index (migration 0015) is the rule.
            taken = await (
                await db.execute(
                    "SELECT min(address) AS address FROM payer_addresses"
                    " WHERE address IN (SELECT value FROM json_each(?)) AND project_id <> ?",
                    (orjson.dumps(addresses).decode(), project_id),
                )
            ).fetchone()
            if taken is not None and taken["address"] is not None:
                raise PayerAddressTaken(taken["address"])
            await db.execute("DELETE FROM payer_addresses WHERE project_id = ?", (project_id,))
            await db.executemany(
                "INSERT INTO payer_addresses (project_id, address) VALUES (?, ?)"
                " ON CONFLICT (project_id, address) DO NOTHING",  # a repeated address
                [(project_id, address) for address in addresses],
            )
            await self._record(db, audit)

    # -- Leases (migrations/sqlite/0012_leases.sql): every write one group-committed statement

    async def grant_lease(self, lease: ReservationRecord) -> None:
        r = lease
        await self._write(
            "INSERT INTO reservations (id, project_id, key_id, amount, month, owner, lease_until,"
            " created_at, lease) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)",
            (r.id, r.project_id, r.key_id, r.amount, r.month, r.owner, r.lease_until, r.created_at),
        )

    async def return_lease(self, lease_id: str, amount: int) -> bool:
        returned = await self._write(
            "UPDATE reservations SET amount = amount - ?, recalled = 0"
            " WHERE id = ? AND lease = 1 AND amount >= ?",
            (amount, lease_id, amount),
        )
        return returned == 1

    async def mark_in_use(self, uses: list[tuple[str, int]]) -> None:
        await self._writer.execute_unit(
            [
                (
                    "UPDATE reservations SET in_use = ?2 WHERE id = ?1 AND lease = 1",
                    [(lease_id, in_use) for lease_id, in_use in uses],
                )
            ]
        )

    async def recall_leases(self, project_id: str, owner: str) -> int:
        return await self._write(
            "UPDATE reservations SET recalled = 1"
            " WHERE project_id = ? AND lease = 1 AND owner <> ? AND recalled = 0",
            (project_id, owner),
        )

    async def pending_recalls(self, project_id: str, owner: str) -> int:
        row = await self._fetchone(
            "SELECT count(*) FROM reservations"
            " WHERE project_id = ? AND lease = 1 AND owner <> ? AND recalled = 1",
            (project_id, owner),
        )
        return 0 if row is None else int(row[0])

    async def recalled_leases(self, owner: str) -> list[str]:
        rows = await self._glance(
            "SELECT id FROM reservations WHERE owner = ? AND lease = 1 AND recalled = 1", (owner,)
        )
        return [row["id"] for row in rows]

    async def lease_audit(self, project_id: str) -> tuple[int, int]:
        row = await self._fetchone(
            "SELECT p.leased, (SELECT COALESCE(SUM(amount), 0) FROM reservations"
            "  WHERE project_id = p.id AND lease = 1) AS held FROM projects p WHERE p.id = ?",
            (project_id,),
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return int(row["leased"]), int(row["held"])
