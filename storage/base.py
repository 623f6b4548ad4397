"""The storage interface. Backends live one per module and are chosen by URL in `open_storage`."""

from __future__ import annotations

import abc
import functools
import inspect
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, ClassVar, ParamSpec, Self, TypeVar, cast

import msgspec


class StorageError(Exception):
    """A backend failure. Its message never reaches a client (it may hold SQL or paths)."""


class RecordNotFound(StorageError):
    pass


class StateConflict(StorageError):
    """The operation does not fit the record's current state (e.g. revoking a revoked key)."""


class AmountOverflow(StateConflict):
    """The write would take a balance or a sum past MAX_AMOUNT: nothing of it was written."""


class PayerAddressTaken(StateConflict):
    """Another project holds this payer address: an address belongs to at most one project
    of the deployment, so that a transfer from it is credited to that project alone."""

    def __init__(self, address: str) -> None:
        super().__init__(f"payer address {address} belongs to another project")
        self.address = address


class LimitReached(StorageError):
    """A reservation was refused; `reason` is budget_exceeded or insufficient_balance."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# The most micro-units a balance, or any sum of them, may hold: a signed 64-bit column's
# largest value. Past it PostgreSQL refuses the statement and SQLite silently turns the
# sum into an inexact REAL, so a credit that would pass it is refused (AmountOverflow).
MAX_AMOUNT = 2**63 - 1

log = logging.getLogger(__name__)


def log_migration_notes(version: int, notes: list[str]) -> None:
    """What a migration changed in the operator's own data (a payer address it took from a
    project, say), one warning each, at migration time: the operator must hear of it."""
    for note in notes:
        log.warning("storage migration %d: %s", version, note)


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


class SandboxRecord(msgspec.Struct, kw_only=True):
    id: str
    project_id: str
    runtime: str  # python | node | bash
    timeout_s: int
    memory_mb: int
    created_at: int = 0


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


def _wrapped(function: object) -> bool:
    return bool(getattr(function, "__translates__", False))


def new_id(kind: str) -> str:
    return f"{kind}_{secrets.token_hex(8)}"


def now_s() -> int:
    return int(time.time())


P = ParamSpec("P")
R = TypeVar("R")


def _translating(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """Wrap one public coroutine method of a backend: its driver's exceptions leave it as
    StorageError (or the subclass the backend's `translate_error` picks)."""
    operation = fn.__name__

    @functools.wraps(fn)
    async def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        # The instance, or the class for a classmethod such as `open`.
        owner = cast("Storage | type[Storage]", args[0])
        try:
            return await fn(*args, **kwargs)
        except StorageError:
            raise
        except owner.base_exceptions as exc:
            raise owner.translate_error(exc, operation) from exc

    translated.__translates__ = True  # type: ignore[attr-defined]
    return translated


class Storage(abc.ABC):
    """The interface every backend implements.

    Driver errors are translated once, here: every public coroutine method a subclass
    defines (classmethods such as `open` included) is wrapped so that an exception of the
    backend's `base_exceptions` leaves it as the StorageError that `translate_error` makes
    of it. Backend methods never catch their driver's exceptions themselves
    (tests/storage/test_error_translation.py checks it); errors they raise on purpose
    (RecordNotFound, StateConflict, ...) are StorageErrors and pass unchanged.
    """

    #: The driver's exception classes, translated to StorageError by the wrapper.
    base_exceptions: ClassVar[tuple[type[BaseException], ...]] = ()
    #: Whether a call may cancel the task that awaits it (a timeout or cancel scope of its
    #: own, as asyncpg's): a meter over a storage whose calls never do runs its calls in the
    #: caller's task (`runs_in_caller`, pipeline/ports.py).
    self_cancelling: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, member in list(vars(cls).items()):
            if name.startswith("_"):
                continue
            if isinstance(member, classmethod):
                function = member.__func__
                if inspect.iscoroutinefunction(function) and not _wrapped(function):
                    setattr(cls, name, classmethod(_translating(function)))
            elif inspect.iscoroutinefunction(member) and not _wrapped(member):
                setattr(cls, name, _translating(member))

    @classmethod
    def translate_error(cls, exc: BaseException, operation: str) -> StorageError:
        """The StorageError for a driver exception `exc` raised by method `operation`.

        A backend refines it (a trigger's message that means LimitReached, a constraint
        that means StateConflict). The message is for operators' logs and never reaches
        a client; keep SQL text out of it.
        """
        return StorageError(f"{cls.__name__}.{operation}: {type(exc).__name__}")

    @classmethod
    @abc.abstractmethod
    async def open(cls, url: str) -> Self:
        """Connect to the backend at `url`, creating and migrating its schema if needed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections."""

    @abc.abstractmethod
    async def health(self) -> None:
        """Raise StorageError when the backend cannot answer."""

    async def checkpoint(self) -> None:  # noqa: B027 (optional: most backends need nothing)
        """Periodic housekeeping of the backend's write log, if it has one."""

    def writes_idle(self) -> bool:
        """True when none of this process's request-path writes (holds, settlements) runs
        or waits: a hold taken now would commit alone, not share a batch's commit."""
        return True

    @abc.abstractmethod
    def admin_epoch(self) -> Hashable:
        """A cheap token that changes after any key or project change, by any process."""

    # -- Instances and admin changes (migrations 0009 postgres, 0010 sqlite) ---------------
    # Every key or project change takes the next admin change number. Each serving process
    # registers as an instance with a lease (the database's clock, milliseconds) and
    # acknowledges the newest change its caches reflect; an admin command waits until every
    # live instance acknowledged its change (gateway/admin_confirm.py).

    #: False when every process sees a change at its next request without being told (a
    #: file stat): an admin command then has nothing to wait for.
    instances_acknowledge_changes: ClassVar[bool] = True

    _admin_applied: int = 0

    def admin_applied(self) -> int:
        """The newest admin change number this handle's epoch reflects (in memory)."""
        return self._admin_applied

    def catch_up_admin(self, change: int) -> None:
        """`change` was read from the database: if this handle had not heard of it, move
        its epoch (caches keyed on it drop) and count it applied. No I/O."""
        self._admin_applied = max(self._admin_applied, change)

    def watch_admin(self, callback: Callable[[int], None]) -> None:  # noqa: B027
        """Call `callback(change)` when this handle hears of an admin change (a backend
        that is not told of changes never calls it)."""

    @abc.abstractmethod
    async def admin_change(self) -> int:
        """The newest admin change number (0 before any change)."""

    @abc.abstractmethod
    async def renew_instance(self, instance_id: str, lease_ms: int, acked: int) -> int:
        """Register the instance or extend its lease to `lease_ms` from now (the database's
        clock), raising its acknowledged change to at least `acked`; return the newest
        admin change number, read after the renewal (what the instance must apply before
        it serves on)."""

    @abc.abstractmethod
    async def acknowledge_admin(self, instance_id: str, change: int) -> None:
        """Raise the instance's acknowledged change to at least `change` (its lease
        unchanged; a no-op for an unknown instance)."""

    @abc.abstractmethod
    async def deregister_instance(self, instance_id: str) -> None:
        """Remove the instance (a clean shutdown); a no-op when it is not registered."""

    @abc.abstractmethod
    async def list_instances(self) -> list[InstanceRecord]:
        """Every registered instance, by id, with `live` judged on the database's clock."""

    @abc.abstractmethod
    async def forget_instances(self, expired_for_ms: int) -> int:
        """Remove instances whose lease ended more than `expired_for_ms` ago; how many."""

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
        """Append a credit entry to the project's ledger (RecordNotFound, AmountOverflow)."""

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
    async def release_abandoned(self, owner_alive: Callable[[str], bool | None]) -> int:
        """Release reservations whose lease expired or whose owner is dead
        (`owner_alive(owner) -> bool | None`, None: cannot tell); return how many."""

    @abc.abstractmethod
    async def project_account(self, project_id: str, month: str) -> Account:
        """Balance, open reservations, open leases and the month's spend of a project
        (RecordNotFound)."""

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
        """Receipts in neither log_leaves nor log_entries, oldest first (settlement order)."""

    @abc.abstractmethod
    async def unlogged_receipt_ids(self, limit: int) -> list[tuple[str, int]]:
        """The ids of `unlogged_receipts(limit)` and when each was issued (`created_at`),
        without reading the receipts: the log builds its leaves from the receipts its own
        process settled, when it has them."""

    @abc.abstractmethod
    async def skip_unloggable(self, receipt_ids: list[str]) -> None:
        """Receipts the log can never take (their public form does not validate): unlogged
        no more, for every process, once the next receipt is logged, so that no follower
        waits for them."""

    @abc.abstractmethod
    async def log_leaves(self, start: int = 0, limit: int | None = None) -> list[LogLeaf]:
        """Leaves logged before tiles, from index `start` on, in index order, at most
        `limit` of them (None: all)."""

    @abc.abstractmethod
    async def log_leaf(self, receipt_id: str) -> LogLeaf | None:
        """The receipt's leaf logged before tiles, or None (not logged, or logged with tiles)."""

    @abc.abstractmethod
    async def tree_head(self, size: int | None = None) -> TreeHeadRecord | None:
        """The signed tree head of that size, or the latest; None when there is none."""

    @abc.abstractmethod
    async def append_log_tiles(
        self, entries: list[LogEntry], tiles: list[LogTile], head: TreeHeadRecord | None
    ) -> None:
        """One integration, all or nothing: insert the entries (a leaf index or receipt id
        already logged is a conflict), write each tile (new, or replacing the stored tile
        at its level and index by one at least as long that starts with it: a tile never
        shrinks or changes a hash it holds; rewriting the same bytes is allowed) and insert
        the signed head if any (a size already signed is a conflict). Compare-and-set: the
        entries are the leaves [head.size - len(entries), head.size), so the append must
        continue the latest stored head, whose size is head.size - len(entries) (0: none).
        StateConflict, with nothing written, when another writer got there first or the
        append does not start where the stored log ends. (head None: tiles only, for
        leaves logged before tiles.)"""

    @abc.abstractmethod
    async def claim_log_sequencer(self) -> bool:
        """Take, or keep, the lock that makes this handle the log's one sequencer (the one
        process that appends and signs); True while it holds it. The log calls it before
        every integration and at least every second while it follows: a backend may take
        the lock away from a holder that stops calling."""

    @abc.abstractmethod
    async def log_tiles(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        """The stored tiles at these (level, index) keys, as they stand now (a partial
        tile may be wider than when a given head was signed); missing keys are absent."""

    @abc.abstractmethod
    async def log_entry_index(self, receipt_id: str) -> int | None:
        """The leaf index of a receipt logged with tiles, or None."""

    @abc.abstractmethod
    async def log_entry_receipts(self, start: int, end: int) -> list[tuple[int, ReceiptRecord]]:
        """(leaf index, receipt) of the entries logged with tiles in [start, end), in
        index order."""

    # The console (migration 0005): users, grants, sessions, sign-in throttle, payments,
    # and the read models of its pages.

    @abc.abstractmethod
    async def create_user(self, user: UserRecord, role: str | None) -> UserRecord:
        """Insert a console user; `role` None: owner when it is the first user, else member
        (StateConflict: the email exists)."""

    @abc.abstractmethod
    async def get_user(self, email: str) -> UserRecord | None:
        """The user with this email (case-insensitive), or None."""

    @abc.abstractmethod
    async def list_users(self) -> list[UserRecord]:
        """Every user, oldest first."""

    @abc.abstractmethod
    async def disable_user(self, email: str) -> UserRecord:
        """Disable a user and end their sessions (RecordNotFound)."""

    @abc.abstractmethod
    async def grant_project(self, email: str, project_id: str) -> None:
        """Let a user see a project; granting twice is a no-op (RecordNotFound)."""

    @abc.abstractmethod
    async def granted_projects(self, user_id: str) -> set[str]:
        """The ids of the projects granted to the user."""

    @abc.abstractmethod
    async def create_session(self, id_hash: bytes, user_id: str, now: int) -> None:
        """Store a new session."""

    @abc.abstractmethod
    async def session_user(self, id_hash: bytes, idle_since: int) -> UserRecord | None:
        """The enabled user of a session seen at or after `idle_since`, or None."""

    @abc.abstractmethod
    async def touch_session(self, id_hash: bytes, now: int) -> None:
        """Record that the session was used now."""

    @abc.abstractmethod
    async def delete_session(self, id_hash: bytes) -> None:
        """End a session (no-op when it is gone)."""

    @abc.abstractmethod
    async def purge_console(self, sessions_seen_before: int, failures_before: int) -> None:
        """Forget expired sessions and failed sign-ins that no longer count."""

    @abc.abstractmethod
    async def record_login_failure(self, subjects: list[str], now: int) -> None:
        """One failed sign-in under each subject."""

    @abc.abstractmethod
    async def login_failures(self, subject: str, since: int) -> list[int]:
        """Times of the subject's failures at or after `since`, oldest first."""

    @abc.abstractmethod
    async def clear_login_failures(self, subject: str) -> None:
        """Forget a subject's failures (after a successful sign-in)."""

    @abc.abstractmethod
    async def list_projects(self, ids: set[str] | None = None) -> list[ProjectRecord]:
        """Every project, or those with the given ids; newest first."""

    @abc.abstractmethod
    async def update_project(self, project_id: str, changes: dict[str, object]) -> ProjectRecord:
        """Change monthly_budget, rpm, allow_models, exclude_models of an active project
        (RecordNotFound, StateConflict when archived)."""

    @abc.abstractmethod
    async def update_key(self, prefix: str, changes: dict[str, object]) -> KeyRecord:
        """Change name, models, monthly_limit, expires_at, rpm of a usable key
        (RecordNotFound, StateConflict when revoked)."""

    @abc.abstractmethod
    async def list_keys(self, project_id: str) -> list[KeyListing]:
        """The project's keys with their label and last use, newest first."""

    @abc.abstractmethod
    async def usage(
        self, project_id: str, start_us: int, end_us: int, group_by: str
    ) -> list[dict[str, object]]:
        """Receipts in [start_us, end_us) summed per day, model or key: `group`, `requests`,
        `input_tokens`, `output_tokens`, `sandbox_ms`, `cost`."""

    @abc.abstractmethod
    async def list_receipts(
        self, project_id: str, limit: int, before: int | None
    ) -> list[tuple[int, ReceiptRecord]]:
        """The project's receipts newest first, as (position, receipt); `before` a position."""

    @abc.abstractmethod
    async def list_ledger(
        self, project_id: str, limit: int, before: int | None
    ) -> list[LedgerEntry]:
        """The project's ledger newest first; `before` an entry id."""

    @abc.abstractmethod
    async def list_sandboxes(self, project_id: str) -> list[SandboxRecord]:
        """The project's sandbox configurations, newest first."""

    @abc.abstractmethod
    async def record_payment(self, payment: PaymentRecord) -> PaymentRecord:
        """Credit a payment once per (project, reference), atomically with its ledger entry
        (RecordNotFound, StateConflict: the reference was recorded, AmountOverflow)."""

    @abc.abstractmethod
    async def payer_addresses(self, project_id: str) -> list[str]:
        """The addresses the project pays from, sorted."""

    @abc.abstractmethod
    async def set_payer_addresses(self, project_id: str, addresses: list[str]) -> None:
        """Replace the project's payer addresses (RecordNotFound, StateConflict: archived,
        PayerAddressTaken: another project holds one of them)."""

    @abc.abstractmethod
    async def get_purchase(self, tx_hash: str) -> PurchaseRecord | None:
        """The purchase credited for this transaction, or None."""

    @abc.abstractmethod
    async def record_purchase(self, purchase: PurchaseRecord) -> PurchaseRecord:
        """Credit an onchain purchase once per transaction, atomically with its ledger entry
        (RecordNotFound, StateConflict: the transaction was credited, AmountOverflow)."""

    @abc.abstractmethod
    async def limit_figures(
        self, project_id: str, key_id: str | None, month: str
    ) -> dict[str, int | None]:
        """What a refused reservation was measured against: `balance`, `reserved`,
        `monthly_budget`, `month_spend` of the project and, with a key, `key_monthly_limit`,
        `key_month_spend`, `key_reserved` (micro-units; None where no limit is set)."""

    # -- Hosted agents ---------------------------------------------------------------------
    # Not abstract: a backend without them (the PostgreSQL one, for now) still opens and
    # serves /v1; only the agents engine needs them.

    async def create_agent(self, agent: AgentRecord) -> AgentRecord:
        """Insert an agent of an existing project (RecordNotFound)."""
        raise NotImplementedError

    async def get_agent(self, agent_id: str) -> AgentRecord | None:
        """The agent, or None."""
        raise NotImplementedError

    async def list_agents(self, project_id: str) -> list[AgentRecord]:
        """The project's agents, oldest first."""
        raise NotImplementedError

    async def create_run(self, run: RunRecord) -> RunRecord:
        """Insert a run, leased to `run.owner`."""
        raise NotImplementedError

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None."""
        raise NotImplementedError

    async def list_runs(self, agent_id: str, limit: int = 50) -> list[RunRecord]:
        """The agent's runs, newest first."""
        raise NotImplementedError

    async def run_steps(self, run_id: str) -> list[StepRecord]:
        """The run's steps in order."""
        raise NotImplementedError

    async def begin_step(self, step: StepRecord) -> None:
        """Record the step in flight if its hold fits the run's remaining budget, atomically
        (LimitReached budget_exceeded; StateConflict run_cancelled or run_not_running)."""
        raise NotImplementedError

    async def drop_step(self, run_id: str, seq: int) -> None:
        """Remove a step that never took its project hold, freeing its run budget."""
        raise NotImplementedError

    async def attach_step_hold(self, run_id: str, seq: int, reservation_id: str) -> None:
        """Tie the step to its project hold: settling or releasing that hold closes it."""
        raise NotImplementedError

    async def describe_step(
        self,
        run_id: str,
        seq: int,
        *,
        input_tokens: int,
        output_tokens: int,
        duration_ms: int,
        error: dict[str, object] | None,
    ) -> None:
        """Write what the step did and close its record; a step still in flight (never
        settled) is released."""
        raise NotImplementedError

    async def finish_run(
        self, run_id: str, status: str, output: str | None, error: dict[str, object] | None
    ) -> bool:
        """End a running run (its steps in flight release their holds); False when it had
        already ended."""
        raise NotImplementedError

    async def request_cancel(self, run_id: str) -> RunRecord:
        """Flag a running run for cancellation (RecordNotFound, StateConflict if ended)."""
        raise NotImplementedError

    async def renew_run_leases(self, owner: str, lease_until: int) -> list[str]:
        """Extend the owner's running runs; return those flagged for cancellation."""
        raise NotImplementedError

    async def fail_abandoned_runs(
        self, owner_alive: Callable[[str], bool | None], error: dict[str, object]
    ) -> list[str]:
        """Fail running runs whose lease expired or whose owner is dead (`owner_alive` as
        in release_abandoned), releasing their holds; return their ids."""
        raise NotImplementedError

    # -- Leases (migration 0012, gateway/leased_meter.py) ----------------------------------
    # A lease is a reservation row flagged `lease`, owned by a serving process: admitted,
    # counted, renewed and swept like any hold; `settle` charges a receipt against it
    # (receipt.reservation_id = the lease's id) by taking the cost out of it.

    @abc.abstractmethod
    async def grant_lease(self, lease: ReservationRecord) -> None:
        """Hold `lease.amount` for its owner as a lease, under every rule a reservation
        meets, in one atomic write (LimitReached)."""

    @abc.abstractmethod
    async def return_lease(self, lease_id: str, amount: int) -> bool:
        """Give back `amount` of a lease (0 answers a recall); False, nothing changed,
        when the lease is gone or holds less. Ending a lease is `release(lease_id)`."""

    @abc.abstractmethod
    async def mark_in_use(self, uses: list[tuple[str, int]]) -> None:
        """Write, for each (lease id, amount), what requests in flight hold of the lease
        (migration 0014): `project_account` shows it as reserved, not leased. Gone
        leases are skipped."""

    @abc.abstractmethod
    async def recall_leases(self, project_id: str, owner: str) -> int:
        """Ask every other owner to give back what its leases of the project do not use;
        how many leases were asked."""

    @abc.abstractmethod
    async def pending_recalls(self, project_id: str, owner: str) -> int:
        """How many leases of the project that other owners hold are asked for and not
        yet answered."""

    @abc.abstractmethod
    async def recalled_leases(self, owner: str) -> list[str]:
        """The ids of the owner's leases that another process asked for."""

    @abc.abstractmethod
    async def lease_audit(self, project_id: str) -> tuple[int, int]:
        """The project's `leased` counter and the sum of its open leases."""


class InstanceRecord(msgspec.Struct, kw_only=True):
    id: str  # host:pid:start-time, the owner of its holds and runs
    started_at: int  # milliseconds, the database's clock
    lease_until: int  # milliseconds, the database's clock
    acked: int  # the newest admin change its caches reflect
    live: bool  # its lease has not ended


class UserRecord(msgspec.Struct, kw_only=True):
    id: str
    email: str
    password_hash: str
    role: str = "member"  # owner | member
    disabled: bool = False
    created_at: int = 0


class KeyListing(msgspec.Struct, kw_only=True):
    key: KeyRecord
    name: str | None = None
    last_used_at: int | None = None  # unix seconds of its latest receipt


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
    created_at: int = 0
    closed_at: int | None = None  # set once its usage and error are written


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
