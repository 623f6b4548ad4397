"""The storage's ports: what it offers, one protocol per domain, so that a consumer can be
typed with the one it needs (a session store with `ConsolePort`, the log with `LogPort`).

`Storage` (storage/base.py) is their union, with the backend's life cycle; every backend
implements all of them (storage/sqlite/, storage/postgres/: a module per domain). A
backend may offer more, as a port of its own that `Storage` does not include
(`RateLimitPort`, storage/rate_limit_port.py: PostgreSQL only).

Every method is abstract but the agents' (see `AgentsPort`); the defaults some have are
`Storage`'s.

Audited changes: every administrative change (of AccountsPort, the money an operator adds
in LedgerPort, sessions and failed sign-ins in ConsolePort) takes `audit`, the AuditEntry
that records it, written in the change's own transaction: both are stored, or neither
(AuditPort).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable
from typing import ClassVar, Protocol

from model_gateway.storage.records import (
    Account,
    AgentRecord,
    Audit,
    AuditEntry,
    InstanceRecord,
    KeyListing,
    KeyRecord,
    LedgerEntry,
    LogEntry,
    LogLeaf,
    LogTile,
    PaymentRecord,
    ProjectRecord,
    PurchaseRecord,
    ReceiptRecord,
    ReservationRecord,
    RunRecord,
    SandboxRecord,
    StepRecord,
    TreeHeadRecord,
    UserRecord,
)


class LifecyclePort(Protocol):
    """The backend itself: its health, its housekeeping and its end."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections."""

    @abc.abstractmethod
    async def health(self) -> None:
        """Raise StorageError when the backend cannot answer."""

    @abc.abstractmethod
    async def checkpoint(self) -> None:
        """Periodic housekeeping of the backend's write log, if it has one."""


class AccountsPort(Protocol):
    """Projects, their keys and sandbox configurations; console users and their grants.

    Every key or project change moves the admin epoch (`ClusterPort`)."""

    @abc.abstractmethod
    async def create_project(
        self, project: ProjectRecord, audit: AuditEntry | None = None
    ) -> ProjectRecord:
        """Insert a new project."""

    @abc.abstractmethod
    async def get_project(self, project_id: str) -> ProjectRecord | None:
        """The project, or None."""

    @abc.abstractmethod
    async def list_projects(self, ids: set[str] | None = None) -> list[ProjectRecord]:
        """Every project, or those with the given ids; newest first."""

    @abc.abstractmethod
    async def update_project(
        self, project_id: str, changes: dict[str, object], audit: AuditEntry | None = None
    ) -> ProjectRecord:
        """Change monthly_budget, rpm, tpm, allow_models, exclude_models of an active project
        (RecordNotFound, StateConflict when archived)."""

    @abc.abstractmethod
    async def archive_project(
        self, project_id: str, audit: AuditEntry | None = None
    ) -> ProjectRecord:
        """Archive an active project (RecordNotFound, StateConflict)."""

    @abc.abstractmethod
    async def create_key(
        self, key: KeyRecord, name: str | None = None, audit: AuditEntry | None = None
    ) -> KeyRecord:
        """Insert a new key of an existing project, with its label (RecordNotFound)."""

    @abc.abstractmethod
    async def get_key(self, prefix: str) -> KeyRecord | None:
        """The key with this public prefix, or None."""

    @abc.abstractmethod
    async def list_keys(self, project_id: str) -> list[KeyListing]:
        """The project's keys with their label and last use, newest first."""

    @abc.abstractmethod
    async def update_key(
        self, prefix: str, changes: dict[str, object], audit: AuditEntry | None = None
    ) -> KeyRecord:
        """Change name, models, monthly_limit, expires_at, rpm, tpm of a usable key
        (RecordNotFound, StateConflict when revoked)."""

    @abc.abstractmethod
    async def revoke_key(self, prefix: str, audit: AuditEntry | None = None) -> KeyRecord:
        """Revoke a usable key (RecordNotFound, StateConflict)."""

    @abc.abstractmethod
    async def create_sandbox(self, sandbox: SandboxRecord) -> SandboxRecord:
        """Insert a sandbox configuration of an existing project (RecordNotFound)."""

    @abc.abstractmethod
    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        """The sandbox configuration, or None."""

    @abc.abstractmethod
    async def list_sandboxes(self, project_id: str) -> list[SandboxRecord]:
        """The project's sandbox configurations, newest first."""

    # Console users (migration 0005).

    @abc.abstractmethod
    async def create_user(
        self, user: UserRecord, role: str | None, audit: AuditEntry | None = None
    ) -> UserRecord:
        """Insert a console user; `role` None: owner when it is the first user, else member
        (StateConflict: the email exists). The audit entry's changes get the role chosen."""

    @abc.abstractmethod
    async def get_user(self, email: str) -> UserRecord | None:
        """The user with this email (case-insensitive), or None."""

    @abc.abstractmethod
    async def list_users(self) -> list[UserRecord]:
        """Every user, oldest first."""

    @abc.abstractmethod
    async def disable_user(self, email: str, audit: AuditEntry | None = None) -> UserRecord:
        """Disable a user and end their sessions (RecordNotFound)."""

    @abc.abstractmethod
    async def grant_project(
        self, email: str, project_id: str, audit: AuditEntry | None = None
    ) -> None:
        """Let a user see a project; granting twice is a no-op (RecordNotFound)."""

    @abc.abstractmethod
    async def granted_projects(self, user_id: str) -> set[str]:
        """The ids of the projects granted to the user."""


class LedgerPort(Protocol):
    """The money: holds, settlements and their receipts, leases, credits, payments,
    purchases and payer addresses, and the read models of a project's account.

    Leases (migration 0012, gateway/metering/leased_meter.py): a lease is a reservation row flagged
    `lease`, owned by a serving process: admitted, counted, renewed and swept like any
    hold; `settle` charges a receipt against it (receipt.reservation_id = the lease's id)
    by taking the cost out of it."""

    @abc.abstractmethod
    def writes_idle(self) -> bool:
        """True when none of this process's request-path writes (holds, settlements) runs
        or waits: a hold taken now would commit alone, not share a batch's commit."""

    @abc.abstractmethod
    async def add_credit(
        self, project_id: str, amount: int, month: str, audit: AuditEntry | None = None
    ) -> None:
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
    async def audit(self, project_id: str, month: str) -> Audit:
        """The project's counters and the sums of the rows they summarise."""

    @abc.abstractmethod
    async def limit_figures(
        self, project_id: str, key_id: str | None, month: str
    ) -> dict[str, int | None]:
        """What a refused reservation was measured against: `balance`, `reserved`,
        `monthly_budget`, `month_spend` of the project and, with a key, `key_monthly_limit`,
        `key_month_spend`, `key_reserved` (micro-units; None where no limit is set)."""

    @abc.abstractmethod
    async def get_receipt(self, receipt_id: str) -> ReceiptRecord | None:
        """The receipt, or None."""

    @abc.abstractmethod
    async def list_receipts(
        self, project_id: str, limit: int, before: int | None
    ) -> list[tuple[int, ReceiptRecord]]:
        """The project's receipts newest first, as (position, receipt); `before` a position."""

    @abc.abstractmethod
    async def usage(
        self, project_id: str, start_us: int, end_us: int, group_by: str
    ) -> list[dict[str, object]]:
        """Receipts in [start_us, end_us) summed per day, model or key: `group`, `requests`,
        `input_tokens`, `output_tokens`, `cached_input_tokens`, `cache_write_tokens`,
        `reasoning_tokens` (0 for receipts without them), `sandbox_ms`, `cost`, and
        `cache_savings`: the sum of cached_input_tokens x (input price - cached input price)
        over receipts that carry the prices applied, in micro-units rounded down once per
        group (informational: nothing is billed or credited by it)."""

    @abc.abstractmethod
    async def list_ledger(
        self, project_id: str, limit: int, before: int | None
    ) -> list[LedgerEntry]:
        """The project's ledger newest first; `before` an entry id."""

    @abc.abstractmethod
    async def record_payment(
        self, payment: PaymentRecord, audit: AuditEntry | None = None
    ) -> PaymentRecord:
        """Credit a payment once per (project, reference), atomically with its ledger entry
        (RecordNotFound, StateConflict: the reference was recorded, AmountOverflow)."""

    @abc.abstractmethod
    async def get_purchase(self, tx_hash: str) -> PurchaseRecord | None:
        """The purchase credited for this transaction, or None."""

    @abc.abstractmethod
    async def record_purchase(
        self, purchase: PurchaseRecord, audit: AuditEntry | None = None
    ) -> PurchaseRecord:
        """Credit an onchain purchase once per transaction, atomically with its ledger entry
        (RecordNotFound, StateConflict: the transaction was credited, AmountOverflow)."""

    @abc.abstractmethod
    async def payer_addresses(self, project_id: str) -> list[str]:
        """The addresses the project pays from, sorted."""

    @abc.abstractmethod
    async def set_payer_addresses(
        self, project_id: str, addresses: list[str], audit: AuditEntry | None = None
    ) -> None:
        """Replace the project's payer addresses (RecordNotFound, StateConflict: archived,
        PayerAddressTaken: another project holds one of them)."""

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


class LogPort(Protocol):
    """The transparency log: the receipts waiting for it, its leaves, tiles and signed
    heads, and the lock of its one sequencer."""

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


class ConsolePort(Protocol):
    """The console's sign-in state (migration 0005): sessions and the sign-in throttle."""

    @abc.abstractmethod
    async def create_session(
        self, id_hash: bytes, user_id: str, now: int, audit: AuditEntry | None = None
    ) -> None:
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
    async def record_login_failure(
        self, subjects: list[str], now: int, audit: AuditEntry | None = None
    ) -> None:
        """One failed sign-in under each subject."""

    @abc.abstractmethod
    async def login_failures(self, subject: str, since: int) -> list[int]:
        """Times of the subject's failures at or after `since`, oldest first."""

    @abc.abstractmethod
    async def clear_login_failures(self, subject: str) -> None:
        """Forget a subject's failures (after a successful sign-in)."""


class AuditPort(Protocol):
    """The audit log (migration 0019): append-only. An entry is written only with the change
    it records, by that change's method (`audit`); no method updates or deletes one."""

    @abc.abstractmethod
    async def list_audit(
        self,
        limit: int,
        before: int | None,
        *,
        action: str | None = None,
        actor: str | None = None,
    ) -> list[tuple[int, AuditEntry]]:
        """Entries newest first as (position, entry), those of one action or actor when
        given; `before` a position."""


class AgentsPort(Protocol):
    """Hosted agents: agents, their runs and the runs' steps, a run's budget kept by the
    statements that move the money.

    Not abstract: a backend without them still opens and serves /v1 (they raise
    NotImplementedError); only the agents engine needs them."""

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
        transcript: dict[str, object] | None = None,
    ) -> None:
        """Write what the step did (its transcript included) and close its record; a step
        still in flight (never settled) is released."""
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


class ClusterPort(Protocol):
    """The serving processes: the admin epoch, the instances and admin changes.

    Instances and admin changes (migrations 0009 postgres, 0010 sqlite): every key or
    project change takes the next admin change number. Each serving process registers as
    an instance with a lease (the database's clock, milliseconds) and acknowledges the
    newest change its caches reflect; an admin command waits until every live instance
    acknowledged its change (gateway/cluster/admin_confirm.py)."""

    #: False when every process sees a change at its next request without being told (a
    #: file stat): an admin command then has nothing to wait for.
    instances_acknowledge_changes: ClassVar[bool]

    @abc.abstractmethod
    def admin_epoch(self) -> Hashable:
        """A cheap token that changes after any key or project change, by any process."""

    @abc.abstractmethod
    def admin_applied(self) -> int:
        """The newest admin change number this handle's epoch reflects (in memory)."""

    @abc.abstractmethod
    def catch_up_admin(self, change: int) -> None:
        """`change` was read from the database: if this handle had not heard of it, move
        its epoch (caches keyed on it drop) and count it applied. No I/O."""

    @abc.abstractmethod
    def watch_admin(self, callback: Callable[[int], None]) -> None:
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
