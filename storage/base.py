"""The storage interface. Backends live one per module and are chosen by URL in `open_storage`."""

from __future__ import annotations

import abc
import secrets
import time
from collections.abc import Hashable

import msgspec


class StorageError(Exception):
    """A backend failure. Its message never reaches a client (it may hold SQL or paths)."""


class RecordNotFound(StorageError):
    pass


class StateConflict(StorageError):
    """The operation does not fit the record's current state (e.g. revoking a revoked key)."""


class LimitReached(StorageError):
    """A reservation was refused; `reason` is budget_exceeded or insufficient_balance."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProjectRecord(msgspec.Struct, kw_only=True):
    id: str
    name: str
    state: str = "active"  # active | archived
    monthly_budget: int | None = None  # micro-units; None: no budget
    rpm: int | None = None  # None: the configured default
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
    state: str = "usable"  # usable | revoked
    created_at: int = 0


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
    request_sha256: str
    response_sha256: str


class SandboxRecord(msgspec.Struct, kw_only=True):
    id: str
    project_id: str
    runtime: str  # python | node | bash
    timeout_s: int
    memory_mb: int
    created_at: int = 0


class LogLeaf(msgspec.Struct, kw_only=True):
    leaf_index: int
    receipt_id: str
    public_receipt: bytes  # canonical encoding of the receipt's public fields
    signature: str


class TreeHeadRecord(msgspec.Struct, kw_only=True):
    size: int
    root_hash: str
    timestamp: str
    key_id: str
    signature: str


class Account(msgspec.Struct, kw_only=True):
    balance: int
    reserved: int
    month_spend: int


class Audit(msgspec.Struct, kw_only=True):
    """A project's counters beside the sums they must equal."""

    balance: int
    ledger_sum: int
    reserved: int
    open_reservations_sum: int
    month_spend: int
    month_charges_sum: int


def new_id(kind: str) -> str:
    return f"{kind}_{secrets.token_hex(8)}"


def now_s() -> int:
    return int(time.time())


class Storage(abc.ABC):
    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections."""

    @abc.abstractmethod
    async def health(self) -> None:
        """Raise StorageError when the backend cannot answer."""

    async def checkpoint(self) -> None:  # noqa: B027 (optional: most backends need nothing)
        """Periodic housekeeping of the backend's write log, if it has one."""

    @abc.abstractmethod
    def admin_epoch(self) -> Hashable:
        """A cheap token that changes after any key or project change, by any process."""

    @abc.abstractmethod
    async def create_project(self, project: ProjectRecord) -> ProjectRecord:
        """Insert a new project."""

    @abc.abstractmethod
    async def get_project(self, project_id: str) -> ProjectRecord | None:
        """The project, or None."""

    @abc.abstractmethod
    async def archive_project(self, project_id: str) -> ProjectRecord:
        """Archive an active project (RecordNotFound, StateConflict)."""

    @abc.abstractmethod
    async def create_key(self, key: KeyRecord) -> KeyRecord:
        """Insert a new key of an existing project (RecordNotFound)."""

    @abc.abstractmethod
    async def get_key(self, prefix: str) -> KeyRecord | None:
        """The key with this public prefix, or None."""

    @abc.abstractmethod
    async def revoke_key(self, prefix: str) -> KeyRecord:
        """Revoke a usable key (RecordNotFound, StateConflict)."""

    @abc.abstractmethod
    async def add_credit(self, project_id: str, amount: int, month: str) -> None:
        """Append a credit entry to the project's ledger (RecordNotFound)."""

    @abc.abstractmethod
    async def reserve(self, reservation: ReservationRecord) -> None:
        """Check limits, budget and available balance and hold the amount, atomically
        (LimitReached)."""

    @abc.abstractmethod
    async def settle(self, receipt: ReceiptRecord) -> bool:
        """Consume the receipt's reservation, charge its cost and store it, atomically;
        False (and nothing written) when the reservation is gone."""

    @abc.abstractmethod
    async def release(self, reservation_id: str) -> None:
        """Drop a reservation, if it is still open."""

    @abc.abstractmethod
    async def renew_leases(self, owner: str, lease_until: int) -> None:
        """Extend every reservation the owner holds."""

    @abc.abstractmethod
    async def release_abandoned(self, owner_alive) -> int:
        """Release reservations whose lease expired or whose owner is dead
        (`owner_alive(owner) -> bool | None`, None: cannot tell); return how many."""

    @abc.abstractmethod
    async def project_account(self, project_id: str, month: str) -> Account:
        """Balance, open reservations and the month's spend of a project (RecordNotFound)."""

    @abc.abstractmethod
    async def key_month_spend(self, key_id: str, month: str) -> int:
        """What the key was charged in the month."""

    @abc.abstractmethod
    async def get_receipt(self, receipt_id: str) -> ReceiptRecord | None:
        """The receipt, or None."""

    @abc.abstractmethod
    async def audit(self, project_id: str, month: str) -> Audit:
        """The project's counters and the sums of the rows they summarise."""

    @abc.abstractmethod
    async def create_sandbox(self, sandbox: SandboxRecord) -> SandboxRecord:
        """Insert a sandbox configuration of an existing project (RecordNotFound)."""

    @abc.abstractmethod
    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        """The sandbox configuration, or None."""

    @abc.abstractmethod
    async def unlogged_receipts(self, limit: int) -> list[ReceiptRecord]:
        """Receipts not yet in the transparency log, oldest first."""

    @abc.abstractmethod
    async def append_log(self, leaves: list[LogLeaf], head: TreeHeadRecord) -> None:
        """Append leaves (continuing the index) and their signed tree head, atomically."""

    @abc.abstractmethod
    async def log_leaves(self, start: int = 0) -> list[LogLeaf]:
        """Leaves from `start` on, in index order."""

    @abc.abstractmethod
    async def log_leaf(self, receipt_id: str) -> LogLeaf | None:
        """The receipt's leaf, or None when it is not integrated yet."""

    @abc.abstractmethod
    async def tree_head(self, size: int | None = None) -> TreeHeadRecord | None:
        """The signed tree head of that size, or the latest; None when there is none."""
