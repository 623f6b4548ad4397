"""The storage interface: `Storage`, the union of the domain ports (storage/ports.py) with
the backend's life cycle, and the one place where driver errors are translated.

Backends live one per package (storage/sqlite/, storage/postgres/), a module per domain,
and are chosen by URL in `open_storage`. The records, errors and helpers the interface
speaks in live in storage/records.py and storage/errors.py, and are importable from here.
"""

from __future__ import annotations

import abc
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, ParamSpec, Self, TypeVar, cast

from model_gateway.storage.errors import (
    AmountOverflow,
    LimitReached,
    PayerAddressTaken,
    RecordNotFound,
    StateConflict,
    StorageError,
)
from model_gateway.storage.ports import (
    AccountsPort,
    AgentsPort,
    AuditPort,
    ClusterPort,
    ConsolePort,
    LedgerPort,
    LifecyclePort,
    LogPort,
)
from model_gateway.storage.records import (
    MAX_AMOUNT,
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
    account,
    ledger_entry,
    new_id,
    now_s,
)

log = logging.getLogger(__name__)


def log_migration_notes(version: int, notes: list[str]) -> None:
    """What a migration changed in the operator's own data (a payer address it took from a
    project, say), one warning each, at migration time: the operator must hear of it."""
    for note in notes:
        log.warning("storage migration %d: %s", version, note)


def _wrapped(function: object) -> bool:
    return bool(getattr(function, "__translates__", False))


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


class Storage(
    LifecyclePort,
    AccountsPort,
    LedgerPort,
    LogPort,
    ConsolePort,
    AuditPort,
    AgentsPort,
    ClusterPort,
):
    """The interface every backend implements: every domain port, and `open`.

    Driver errors are translated once, here: every public coroutine method a subclass
    defines (classmethods such as `open` included) is wrapped so that an exception of the
    backend's `base_exceptions` leaves it as the StorageError that `translate_error` makes
    of it. A backend built of one class per domain (mixins) has each of them subclass
    Storage, so that each one's methods are wrapped where they are defined. Backend methods
    never catch their driver's exceptions themselves (tests/storage/test_error_translation.py
    checks it); errors they raise on purpose (RecordNotFound, StateConflict, ...) are
    StorageErrors and pass unchanged.
    """

    #: The driver's exception classes, translated to StorageError by the wrapper.
    base_exceptions: ClassVar[tuple[type[BaseException], ...]] = ()
    instances_acknowledge_changes: ClassVar[bool] = True  # ClusterPort says what it means

    _admin_applied: int = 0

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

    # Defaults of port methods that most backends keep.

    async def checkpoint(self) -> None:
        """Nothing, for a backend without a write log to tend."""

    def writes_idle(self) -> bool:
        return True

    def admin_applied(self) -> int:
        return self._admin_applied

    def catch_up_admin(self, change: int) -> None:
        self._admin_applied = max(self._admin_applied, change)

    def watch_admin(self, callback: Callable[[int], None]) -> None:
        """Never called back: a backend that is not told of changes."""


__all__ = [
    "MAX_AMOUNT",
    "Account",
    "AccountsPort",
    "AgentRecord",
    "AgentsPort",
    "AmountOverflow",
    "Audit",
    "AuditEntry",
    "AuditPort",
    "ClusterPort",
    "ConsolePort",
    "InstanceRecord",
    "KeyListing",
    "KeyRecord",
    "LedgerEntry",
    "LedgerPort",
    "LifecyclePort",
    "LimitReached",
    "LogEntry",
    "LogLeaf",
    "LogPort",
    "LogTile",
    "PayerAddressTaken",
    "PaymentRecord",
    "ProjectRecord",
    "PurchaseRecord",
    "ReceiptRecord",
    "RecordNotFound",
    "ReservationRecord",
    "RunRecord",
    "SandboxRecord",
    "StateConflict",
    "StepRecord",
    "Storage",
    "StorageError",
    "TreeHeadRecord",
    "UserRecord",
    "account",
    "ledger_entry",
    "log_migration_notes",
    "new_id",
    "now_s",
]
