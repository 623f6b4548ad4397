"""The records the storage interface speaks in, shared by every port and backend, and the
converters and helpers both backends use."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import msgspec

# The most micro-units a balance, or any sum of them, may hold: a signed 64-bit column's
# largest value. Past it PostgreSQL refuses the statement and SQLite silently turns the
# sum into an inexact REAL, so a credit that would pass it is refused (AmountOverflow).
MAX_AMOUNT = 2**63 - 1


# -- Accounts: projects, keys, sandboxes, users ------------------------------------------


class ProjectRecord(msgspec.Struct, kw_only=True):
    id: str
    name: str
    state: str = "active"  # active | archived
    monthly_budget: int | None = None  # micro-units; None: no budget
    rpm: int | None = None  # None: the configured default
    tpm: int | None = None  # tokens per minute; None: no token limit
    allow_models: list[str] | None = None  # None: every model
    exclude_models: list[str] = []
    created_at: int = 0  # unix seconds


class KeyRecord(msgspec.Struct, kw_only=True):
    id: str
    prefix: str
    key_hash: bytes
    project_id: str
    scopes: frozenset[str]
    models: list[str] | None = None  # None: every model the project allows
    monthly_limit: int | None = None  # micro-units
    expires_at: int | None = None  # unix seconds
    rpm: int | None = None
    tpm: int | None = None
    state: str = "usable"  # usable | revoked
    created_at: int = 0


class KeyListing(msgspec.Struct, kw_only=True):
    key: KeyRecord
    name: str | None = None
    last_used_at: int | None = None  # unix seconds of its latest receipt


class SandboxRecord(msgspec.Struct, kw_only=True):
    id: str
    project_id: str
    runtime: str  # python | node | bash
    timeout_s: int
    memory_mb: int
    created_at: int = 0


class UserRecord(msgspec.Struct, kw_only=True):
    id: str
    email: str
    password_hash: str
    role: str = "member"  # owner | member
    disabled: bool = False
    created_at: int = 0


# -- Ledger: holds, receipts, the ledger, payments, purchases ------------------------------


class ReservationRecord(msgspec.Struct, kw_only=True):
    id: str
    project_id: str
    key_id: str | None
    amount: int  # micro-units held
    month: str  # UTC 'YYYY-MM' whose budget and limit it counts against
    owner: str  # the serving process that holds it
    lease_until: int  # unix seconds; after this a sweeper may release it
    created_at: int


class ReceiptRecord(msgspec.Struct, kw_only=True):
    id: str
    reservation_id: str
    project_id: str
    key_id: str | None
    request_id: str
    kind: str  # inference | sandbox
    endpoint: str
    model_or_runtime: str
    status: str  # succeeded | failed
    usage: dict[str, int]
    cost: int  # micro-units charged
    month: str
    created_at: int  # unix microseconds
    request_sha256: str  # plain digests of the bodies: the project's, never published
    response_sha256: str
    # Salted commitments, what the public receipt (v2) carries instead, and their salts
    # (16 bytes, hex), shown only to the project. None on receipts issued before them.
    request_salt: str | None = None
    response_salt: str | None = None
    request_commitment: str | None = None
    response_commitment: str | None = None
    usage_source: str = "provider"  # provider | gateway (the gateway's own count)
    provider: str | None = None  # who served (a fallback's name when it did); None: sandbox


class Account(msgspec.Struct, kw_only=True):
    balance: int
    # Held by requests: their own holds, and what they hold of leases (as last written by
    # the leases' owners, migration 0014; at most what is left of each lease).
    reserved: int
    month_spend: int
    leased: int = 0  # the rest of the serving processes' leases (migration 0012)


class Audit(msgspec.Struct, kw_only=True):
    """A project's counters beside the sums they must equal."""

    balance: int
    ledger_sum: int
    reserved: int
    open_reservations_sum: int
    month_spend: int
    month_charges_sum: int


class LedgerEntry(msgspec.Struct, kw_only=True):
    id: int
    kind: str  # credit | payment | charge
    amount: int
    key_id: str | None
    receipt_id: str | None
    reference: str | None
    created_at: int


def ledger_entry(
    row: Any, unpack: Callable[[str, Any], str | None] = lambda _prefix, value: value
) -> LedgerEntry:
    """A listed ledger row (id, kind, amount, key_id, receipt_id, created_at, and the
    reference or tx_hash of the payment or purchase behind a credit) as its entry.
    `unpack` reads an id stored in a backend's own form ("key_", "rcpt_")."""
    return LedgerEntry(
        id=row["id"],
        kind=(
            "payment"
            if row["reference"] is not None
            else "purchase"
            if row["tx_hash"] is not None
            else row["kind"]
        ),
        amount=row["amount"],
        key_id=unpack("key_", row["key_id"]),
        receipt_id=unpack("rcpt_", row["receipt_id"]),
        reference=row["reference"] or row["tx_hash"],
        created_at=row["created_at"],
    )


class PaymentRecord(msgspec.Struct, kw_only=True):
    id: str
    project_id: str
    reference: str
    amount: int
    month: str
    recorded_by: str | None = None
    created_at: int = 0


class PurchaseRecord(msgspec.Struct, kw_only=True):
    tx_hash: str
    project_id: str
    sender: str
    token_units: int
    amount: int  # micro-units credited
    month: str
    created_at: int = 0


def account(row: Any) -> Account:
    """A project's account from its counters (balance, reserved, leased, spent) and what
    requests hold of its leases (in_use): the two backends' `project_account`."""
    in_use = int(row["in_use"])
    return Account(
        balance=int(row["balance"]),
        reserved=int(row["reserved"]) - int(row["leased"]) + in_use,
        month_spend=int(row["spent"]),
        leased=int(row["leased"]) - in_use,
    )


# -- Log: leaves, tiles, signed heads -----------------------------------------------------


class LogLeaf(msgspec.Struct, kw_only=True):
    """A leaf logged before tiles (migration 0006): its public receipt and a per-receipt
    signature stored with it. Never written any more; read to serve those leaves."""

    leaf_index: int
    receipt_id: str
    public_receipt: bytes  # canonical encoding of the receipt's public fields
    signature: str


class LogEntry(msgspec.Struct, kw_only=True):
    """A leaf logged with tiles: only which receipt it is. Its public receipt is rebuilt
    from the receipt row; its leaf hash is in the level-0 tile."""

    leaf_index: int
    receipt_id: str


class LogTile(msgspec.Struct, kw_only=True):
    """A C2SP tile: 1 to 256 concatenated 32-byte hashes at (level, index)."""

    level: int
    index: int
    hashes: bytes


class TreeHeadRecord(msgspec.Struct, kw_only=True):
    size: int
    root_hash: str
    timestamp: str
    key_id: str
    signature: str


# -- Agents: agents, runs, steps ----------------------------------------------------------


class AgentRecord(msgspec.Struct, kw_only=True):
    id: str
    project_id: str
    name: str
    model: str
    instructions: str = ""
    tools: list[str] = []  # [] or ["sandbox"]
    sandbox_id: str | None = None
    max_steps: int = 8
    created_at: int = 0


class RunRecord(msgspec.Struct, kw_only=True):
    id: str
    agent_id: str
    project_id: str
    input: str
    budget: int  # micro-units
    spent: int = 0  # sum of settled steps' costs
    in_flight: int = 0  # sum of the holds of steps in flight
    status: str = "running"  # running | completed | failed | budget_exceeded | cancelled
    output: str | None = None
    error: dict[str, object] | None = None  # {type, message} when the run did not complete
    owner: str
    lease_until: int
    cancel_requested: bool = False
    created_at: int = 0
    finished_at: int | None = None


class StepRecord(msgspec.Struct, kw_only=True):
    run_id: str
    seq: int
    kind: str  # model | sandbox
    subject: str  # model id or runtime
    hold: int  # micro-units reserved against both the run and the project
    state: str = "in_flight"  # in_flight | settled | released
    reservation_id: str | None = None
    cost: int = 0
    receipt_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    duration_ms: int = 0
    error: dict[str, object] | None = None
    # What the step did (gateway/agents/transcript.py); None until it is described, and
    # for steps recorded before transcripts were kept.
    transcript: dict[str, object] | None = None
    created_at: int = 0
    closed_at: int | None = None  # set once its usage and error are written


# -- Audit: who changed what, append-only ------------------------------------------------


class AuditEntry(msgspec.Struct, kw_only=True):
    """One administrative change or sign-in (decisions.md, Operators (wave 3)): written in
    the transaction of the change it records (the `audit` argument of the change's storage
    method), never updated or deleted. `target` is {"type", "id"} ({"type": "user",
    "email"} for a failed sign-in); `changes` maps each changed field to its new value.
    Never a key, a password, a hash or a session id."""

    id: str
    at: int  # unix seconds
    actor: str  # "cli:<os user>" | "user:<email>" | "anonymous"
    action: str  # "<noun>.<verb>", e.g. "key.revoke"
    target: dict[str, str]
    changes: dict[str, object] = {}
    request_id: str | None = None  # the console request that made it; None from the CLI


# The position an audit listing starts below when no cursor is given (the largest BIGINT).
AUDIT_NEWEST = 2**63 - 1


def audit_entry(row: Any) -> tuple[int, AuditEntry]:
    """A listed audit row (its `target` and `changes` as JSON text) as (position, entry)."""
    return row["seq"], AuditEntry(
        id=row["id"],
        at=row["at"],
        actor=row["actor"],
        action=row["action"],
        target=msgspec.json.decode(row["target"]),
        changes=msgspec.json.decode(row["changes"]),
        request_id=row["request_id"],
    )


def with_changes(audit: AuditEntry | None, **changes: object) -> AuditEntry | None:
    """The entry with what only its change's transaction decides (a new user's role)."""
    if audit is None:
        return None
    return msgspec.structs.replace(audit, changes={**audit.changes, **changes})


# -- Cluster: the instances --------------------------------------------------------------


class InstanceRecord(msgspec.Struct, kw_only=True):
    id: str  # host:pid:start-time, the owner of its holds and runs
    started_at: int  # milliseconds, the database's clock
    lease_until: int  # milliseconds, the database's clock
    acked: int  # the newest admin change its caches reflect
    live: bool  # its lease has not ended


# -- Helpers -----------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return f"{kind}_{secrets.token_hex(8)}"


def now_s() -> int:
    return int(time.time())
