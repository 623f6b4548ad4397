"""Holds, settlements and receipts, leases, credits, payments, purchases and payer
addresses (LedgerPort) on PostgreSQL.

Money rules live in the database (migrations/postgres/0002_metering.sql): a reservation
is one INSERT whose trigger locks the project row, then the key row, checks the key's
monthly limit, the project's monthly budget and the available balance, and holds the
amount; a settlement is one INSERT of the receipt, made only while its hold exists (the
EXISTS subquery locks the hold: a concurrent settlement or release waits, then finds it
gone and the insert writes nothing: `settle` is False), whose trigger deletes the hold
and writes the charge, capped at the hold. Every statement runs in autocommit under READ
COMMITTED; none checks first and writes later. Hosted agents' run budgets are kept the
same way (migrations/postgres/0005_agents.sql: the run row is locked at admission).
Concurrent holds, and concurrent receipts, go as one statement per batch (migration
0015, storage/batching.py): each item under the same triggers; a batch in which one item
raises commits nothing, and its items then run alone.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

import msgspec
import orjson

from model_gateway.storage.batching import Outcome
from model_gateway.storage.errors import PayerAddressTaken, RecordNotFound, StateConflict
from model_gateway.storage.postgres.audit import PostgresAudit
from model_gateway.storage.postgres.connection import Connection, Row, batch_or_each
from model_gateway.storage.postgres.rows import _fields, _receipt
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

# pg_advisory_xact_lock key: one writer of payer addresses at a time.
_PAYERS_LOCK = 0x6D67_7061
# The usage report's sums of the classes within input and output (none: 0).
_CLASS_SUMS = ", ".join(
    f"COALESCE(SUM((r.usage ->> '{name}')::bigint), 0)::bigint AS {name}"
    for name in ("cached_input_tokens", "cache_write_tokens", "reasoning_tokens")
)


def _purchase(row: Row) -> PurchaseRecord:
    return PurchaseRecord(
        **{**_fields(row, PurchaseRecord), "token_units": int(row["token_units"])}
    )


class PostgresLedger(PostgresAudit):
    """The money."""

    async def add_credit(
        self, project_id: str, amount: int, month: str, audit: AuditEntry | None = None
    ) -> None:
        # An unknown project fails the ledger's foreign key: RecordNotFound.
        await self._execute_audited(
            audit,
            "INSERT INTO ledger (project_id, kind, amount, month, created_at)"
            " VALUES ($1, 'credit', $2, $3, $4)",
            project_id,
            amount,
            month,
            now_s(),
        )

    async def reserve(self, reservation: ReservationRecord) -> None:
        # The trigger `reservation_admits` locks, checks and holds, for each item of a
        # batch (migration 0015) as for a statement alone.
        await self._holds.submit(reservation)

    async def settle(self, receipt: ReceiptRecord) -> bool:
        return await self._receipts.submit(receipt)

    async def _reserve_batch(self, batch: list[ReservationRecord]) -> list[Outcome[None]]:
        async def together() -> list[Outcome[None]]:
            await self._many("gateway_reserve_many", batch)
            return [None] * len(batch)

        return await batch_or_each(together, self._reserve_one, batch)

    async def _reserve_one(self, reservation: ReservationRecord) -> None:
        r = reservation
        await self._run(
            lambda c: c.execute(
                "INSERT INTO reservations (id, project_id, key_id, amount, month, owner,"
                " lease_until, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                r.id,
                r.project_id,
                r.key_id,
                r.amount,
                r.month,
                r.owner,
                r.lease_until,
                r.created_at,
            )
        )

    async def _settle_batch(self, batch: list[ReceiptRecord]) -> list[Outcome[bool]]:
        async def together() -> list[Outcome[bool]]:
            return list(await self._many("gateway_settle_many", batch))

        return await batch_or_each(together, self._settle_one, batch)

    async def _settle_one(self, receipt: ReceiptRecord) -> bool:
        r = receipt
        # Inserted only while its hold is open and covers the cost, in the one statement:
        # the subquery locks the hold (a concurrent settlement or release waits, then finds
        # it gone: no row, False). The trigger `receipt_consumes_hold` deletes the hold and
        # writes the charge, and refuses (GWR01) any other writer's receipt without a hold.
        status = await self._run(
            lambda c: c.execute(
                "INSERT INTO receipts (id, reservation_id, project_id, key_id, request_id,"
                " kind, endpoint, model_or_runtime, status, usage, cost, month, created_at,"
                " request_sha256, response_sha256, request_salt, response_salt,"
                " request_commitment, response_commitment, usage_source, provider)"
                " SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12, $13,"
                " $14, $15, $16, $17, $18, $19, $20, $21"
                " WHERE EXISTS (SELECT 1 FROM reservations"
                "  WHERE id = $2 AND project_id = $3 AND amount >= $11 FOR UPDATE)",
                r.id,
                r.reservation_id,
                r.project_id,
                r.key_id,
                r.request_id,
                r.kind,
                r.endpoint,
                r.model_or_runtime,
                r.status,
                orjson.dumps(r.usage).decode(),
                r.cost,
                r.month,
                r.created_at,
                r.request_sha256,
                r.response_sha256,
                r.request_salt,
                r.response_salt,
                r.request_commitment,
                r.response_commitment,
                r.usage_source,
                r.provider,
            )
        )
        return bool(status == "INSERT 0 1")

    async def _many(
        self, function: str, batch: list[ReservationRecord] | list[ReceiptRecord]
    ) -> list[Any]:
        """One call of a batch function (migration 0015), the items sorted by project and
        key so that every batch locks rows in one order; its answers (none for a function
        without) in the batch's order."""
        order = sorted(
            range(len(batch)), key=lambda i: (batch[i].project_id, batch[i].key_id or "")
        )
        payload = msgspec.json.encode([batch[i] for i in order]).decode()
        sorted_answers = await self._run(
            lambda c: c.fetchval(f"SELECT {function}($1::jsonb)", payload)
        )
        answers: list[Any] = [None] * len(sorted_answers or ())
        for position, i in enumerate(order[: len(answers)]):
            answers[i] = sorted_answers[position]
        return answers

    async def release(self, reservation_id: str) -> None:
        await self._run(
            lambda c: c.execute("DELETE FROM reservations WHERE id = $1", reservation_id)
        )

    async def renew_leases(self, owner: str, lease_until: int) -> None:
        await self._run(
            lambda c: c.execute(
                "UPDATE reservations SET lease_until = $1 WHERE owner = $2", lease_until, owner
            )
        )

    async def release_abandoned(self, owner_alive: Callable[[str], bool | None]) -> int:
        now = now_s()

        async def sweep(conn: Connection) -> int:
            owners = await conn.fetch("SELECT DISTINCT owner FROM reservations")
            dead = [row["owner"] for row in owners if owner_alive(row["owner"]) is False]
            rows = await conn.fetch(
                "SELECT id, owner FROM reservations WHERE lease_until < $1 OR owner = ANY($2)",
                now,
                dead,
            )
            released = 0
            for row in rows:
                # One hold per statement, its condition checked again under the row lock (a
                # hold settled or renewed meanwhile stays). One at a time, so that two
                # sweepers never lock several projects in different orders.
                status = await conn.execute(
                    "DELETE FROM reservations"
                    " WHERE id = $1 AND (lease_until < $2 OR owner = ANY($3))",
                    row["id"],
                    now,
                    dead,
                )
                released += int(status.rsplit(" ", 1)[1])
            return released

        return await self._run(sweep)

    async def project_account(self, project_id: str, month: str) -> Account:
        row = await self._run(
            lambda c: c.fetchrow(
                "SELECT p.balance, p.reserved, p.leased, COALESCE(m.spent, 0) AS spent,"
                " (SELECT COALESCE(SUM(LEAST(in_use, amount)), 0) FROM reservations"
                "  WHERE project_id = p.id AND lease) AS in_use"
                " FROM projects p"
                " LEFT JOIN month_spend m ON m.subject = p.id AND m.month = $1 WHERE p.id = $2",
                month,
                project_id,
            )
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return account(row)

    async def key_month_spend(self, key_id: str, month: str) -> int:
        spent = await self._run(
            lambda c: c.fetchval(
                "SELECT spent FROM month_spend WHERE subject = $1 AND month = $2", key_id, month
            )
        )
        return 0 if spent is None else int(spent)

    async def audit(self, project_id: str, month: str) -> Audit:
        # One statement: one snapshot, so the counters and the sums are of the same moment.
        row = await self._run(
            lambda c: c.fetchrow(
                "SELECT p.balance, p.reserved,"
                " (SELECT COALESCE(SUM(CASE kind WHEN 'credit' THEN amount ELSE -amount END), 0)"
                "  FROM ledger WHERE project_id = p.id)::bigint AS ledger_sum,"
                " (SELECT COALESCE(SUM(amount), 0) FROM reservations"
                "  WHERE project_id = p.id)::bigint AS held,"
                " (SELECT COALESCE(SUM(spent), 0) FROM month_spend"
                "  WHERE subject = p.id AND month = $1)::bigint AS month_spend,"
                " (SELECT COALESCE(SUM(amount), 0) FROM ledger"
                "  WHERE project_id = p.id AND kind = 'charge' AND month = $1)::bigint"
                "  AS month_charges"
                " FROM projects p WHERE p.id = $2",
                month,
                project_id,
            )
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
        # One statement: every figure of the same moment.
        row = await self._run(
            lambda c: c.fetchrow(
                "SELECT p.balance, p.reserved, p.monthly_budget,"
                " COALESCE((SELECT spent FROM month_spend WHERE subject = p.id AND month = $1),"
                "  0) AS month_spend,"
                " k.monthly_limit AS key_monthly_limit, k.reserved AS key_reserved,"
                " COALESCE((SELECT spent FROM month_spend WHERE subject = k.id AND month = $1),"
                "  0) AS key_month_spend"
                " FROM projects p LEFT JOIN api_keys k ON k.id = $2 WHERE p.id = $3",
                month,
                key_id,
                project_id,
            )
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return dict(row)

    async def get_receipt(self, receipt_id: str) -> ReceiptRecord | None:
        return await self._one(_receipt, "SELECT * FROM receipts WHERE id = $1", receipt_id)

    async def list_receipts(
        self, project_id: str, limit: int, before: int | None
    ) -> list[tuple[int, ReceiptRecord]]:
        return await self._all(
            lambda row: (int(row["seq"]), _receipt(row)),
            "SELECT * FROM receipts WHERE project_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3",
            project_id,
            2**63 - 1 if before is None else before,
            limit,
        )

    async def usage(
        self, project_id: str, start_us: int, end_us: int, group_by: str
    ) -> list[dict[str, object]]:
        group = {
            "day": "to_char(to_timestamp(r.created_at / 1000000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
            "model": "r.model_or_runtime",
            "key": "k.prefix",
        }[group_by]
        return await self._all(
            lambda row: {**dict(row), "group": row["grp"]},
            f"SELECT {group} AS grp, count(*) AS requests,"  # noqa: S608 (a fixed expression)
            " COALESCE(SUM((r.usage ->> 'input_tokens')::bigint), 0)::bigint"
            "  AS input_tokens,"
            " COALESCE(SUM((r.usage ->> 'output_tokens')::bigint), 0)::bigint"
            "  AS output_tokens,"
            f" {_CLASS_SUMS},"
            # What cache reads saved against the input price, summed exactly (numeric) and
            # rounded down to the micro-unit once; receipts without the prices applied: 0.
            " COALESCE(floor(SUM((r.usage ->> 'cached_input_tokens')::numeric"
            "  * ((r.usage ->> 'input_price_per_mtok')::numeric"
            "   - (r.usage ->> 'cached_input_price_per_mtok')::numeric)) / 1000000), 0)::bigint"
            "  AS cache_savings,"
            " COALESCE(SUM(CASE r.kind WHEN 'sandbox'"
            "  THEN (r.usage ->> 'duration_ms')::bigint END), 0)::bigint AS sandbox_ms,"
            " SUM(r.cost)::bigint AS cost"
            " FROM receipts r LEFT JOIN api_keys k ON k.id = r.key_id"
            " WHERE r.project_id = $1 AND r.created_at >= $2 AND r.created_at < $3"
            " GROUP BY grp ORDER BY grp",
            project_id,
            start_us,
            end_us,
        )

    async def list_ledger(
        self, project_id: str, limit: int, before: int | None
    ) -> list[LedgerEntry]:
        return await self._all(
            ledger_entry,
            "SELECT l.id, l.kind, l.amount, l.key_id, l.receipt_id, l.created_at,"
            " p.reference, u.tx_hash FROM ledger l"
            " LEFT JOIN payments p ON p.ledger_id = l.id"
            " LEFT JOIN purchases u ON u.ledger_id = l.id"
            " WHERE l.project_id = $1 AND l.id < $2 ORDER BY l.id DESC LIMIT $3",
            project_id,
            2**63 - 1 if before is None else before,
            limit,
        )

    @staticmethod
    async def _credit_once(
        conn: Connection,
        project_id: str,
        amount: int,
        month: str,
        created_at: int,
        seen: tuple[str, tuple[object, ...]],
        conflict: str,
    ) -> int:
        """A credit entry for money that arrived once (a payment, a purchase), inside the
        caller's transaction; StateConflict when the `seen` query finds it recorded. Two
        writers racing past that check meet at the unique key of the caller's next insert:
        the loser's transaction, its credit included, fails whole (StateConflict)."""
        if not await conn.fetchval("SELECT 1 FROM projects WHERE id = $1", project_id):
            raise RecordNotFound(f"no project {project_id}")
        if await conn.fetchval(seen[0], *seen[1]):
            raise StateConflict(conflict)
        ledger_id: int = await conn.fetchval(
            "INSERT INTO ledger (project_id, kind, amount, month, created_at)"
            " VALUES ($1, 'credit', $2, $3, $4) RETURNING id",
            project_id,
            amount,
            month,
            created_at,
        )
        return ledger_id

    async def record_payment(
        self, payment: PaymentRecord, audit: AuditEntry | None = None
    ) -> PaymentRecord:
        p = payment

        async def record(conn: Connection) -> None:
            async with conn.transaction():
                ledger_id = await self._credit_once(
                    conn,
                    p.project_id,
                    p.amount,
                    p.month,
                    p.created_at,
                    (
                        "SELECT 1 FROM payments WHERE project_id = $1 AND reference = $2",
                        (p.project_id, p.reference),
                    ),
                    f"payment {p.reference!r} is already recorded",
                )
                await conn.execute(
                    "INSERT INTO payments (id, project_id, reference, amount, ledger_id,"
                    " recorded_by, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    p.id,
                    p.project_id,
                    p.reference,
                    p.amount,
                    ledger_id,
                    p.recorded_by,
                    p.created_at,
                )
                await self._record(conn, audit)

        await self._run(record)
        return payment

    async def get_purchase(self, tx_hash: str) -> PurchaseRecord | None:
        return await self._one(
            _purchase,
            "SELECT u.*, l.month FROM purchases u JOIN ledger l ON l.id = u.ledger_id"
            " WHERE u.tx_hash = $1",
            tx_hash,
        )

    async def record_purchase(
        self, purchase: PurchaseRecord, audit: AuditEntry | None = None
    ) -> PurchaseRecord:
        p = purchase

        async def record(conn: Connection) -> None:
            async with conn.transaction():
                ledger_id = await self._credit_once(
                    conn,
                    p.project_id,
                    p.amount,
                    p.month,
                    p.created_at,
                    ("SELECT 1 FROM purchases WHERE tx_hash = $1", (p.tx_hash,)),
                    f"transaction {p.tx_hash} is already credited",
                )
                await conn.execute(
                    "INSERT INTO purchases (tx_hash, project_id, sender, token_units, amount,"
                    " ledger_id, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    p.tx_hash,
                    p.project_id,
                    p.sender,
                    str(p.token_units),
                    p.amount,
                    ledger_id,
                    p.created_at,
                )
                await self._record(conn, audit)

        await self._run(record)
        return purchase

    async def payer_addresses(self, project_id: str) -> list[str]:
        return await self._all(
            itemgetter("address"),
            "SELECT address FROM payer_addresses WHERE project_id = $1 ORDER BY address",
            project_id,
        )

    async def set_payer_addresses(
        self, project_id: str, addresses: list[str], audit: AuditEntry | None = None
    ) -> None:
        async def replace(conn: Connection) -> None:
            async with conn.transaction():
                # The project row's lock orders concurrent replacements: the last one wins whole.
                state = await conn.fetchval(
                    "SELECT state FROM projects WHERE id = $1 FOR NO KEY UPDATE", project_id
                )
                if state is None:
                    raise RecordNotFound(f"no project {project_id}")
                if state != "active":
                    raise StateConflict(f"project {project_id} is archived")
                # One writer at a time, so this check sees every address registered before
                # and refuses clearly; the unique constraint (migration 0016) is the rule.
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _PAYERS_LOCK)
                taken = await conn.fetchval(
                    "SELECT min(address) FROM payer_addresses"
                    " WHERE address = ANY($2::text[]) AND project_id <> $1",
                    project_id,
                    addresses,
                )
                if taken is not None:
                    raise PayerAddressTaken(taken)
                await conn.execute("DELETE FROM payer_addresses WHERE project_id = $1", project_id)
                await conn.execute(
                    "INSERT INTO payer_addresses (project_id, address)"
                    " SELECT $1, a FROM unnest($2::text[]) a"
                    " ON CONFLICT (project_id, address) DO NOTHING",  # a repeated address
                    project_id,
                    addresses,
                )
                await self._record(conn, audit)

        await self._run(replace)

    # -- Leases (migrations/postgres/0012_leases.sql): each write one autocommit statement

    async def grant_lease(self, lease: ReservationRecord) -> None:
        r = lease
        # The trigger `reservation_admits` locks, checks and holds, as for any hold.
        await self._run(
            lambda c: c.execute(
                "INSERT INTO reservations (id, project_id, key_id, amount, month, owner,"
                " lease_until, created_at, lease) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, true)",
                r.id,
                r.project_id,
                r.key_id,
                r.amount,
                r.month,
                r.owner,
                r.lease_until,
                r.created_at,
            )
        )

    async def return_lease(self, lease_id: str, amount: int) -> bool:
        status = await self._run(
            lambda c: c.execute(
                "UPDATE reservations SET amount = amount - $2, recalled = false"
                " WHERE id = $1 AND lease AND amount >= $2",
                lease_id,
                amount,
            )
        )
        return bool(status == "UPDATE 1")

    async def mark_in_use(self, uses: list[tuple[str, int]]) -> None:
        await self._run(
            lambda c: c.executemany(
                "UPDATE reservations SET in_use = $2 WHERE id = $1 AND lease", uses
            )
        )

    async def recall_leases(self, project_id: str, owner: str) -> int:
        status = await self._run(
            lambda c: c.execute(
                "UPDATE reservations SET recalled = true"
                " WHERE project_id = $1 AND lease AND owner <> $2 AND NOT recalled",
                project_id,
                owner,
            )
        )
        return int(status.rsplit(" ", 1)[1])

    async def pending_recalls(self, project_id: str, owner: str) -> int:
        pending = await self._run(
            lambda c: c.fetchval(
                "SELECT count(*) FROM reservations"
                " WHERE project_id = $1 AND lease AND owner <> $2 AND recalled",
                project_id,
                owner,
            )
        )
        return int(pending)

    async def recalled_leases(self, owner: str) -> list[str]:
        return await self._all(
            itemgetter("id"),
            "SELECT id FROM reservations WHERE owner = $1 AND lease AND recalled",
            owner,
        )

    async def lease_audit(self, project_id: str) -> tuple[int, int]:
        row = await self._run(
            lambda c: c.fetchrow(
                "SELECT p.leased, (SELECT COALESCE(SUM(amount), 0) FROM reservations"
                "  WHERE project_id = p.id AND lease)::bigint AS held"
                " FROM projects p WHERE p.id = $1",
                project_id,
            )
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return int(row["leased"]), int(row["held"])
