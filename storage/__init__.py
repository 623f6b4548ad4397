"""Pluggable storage: `open_storage(url)` picks the backend from the URL scheme.

The interface is `Storage` (storage/base.py), the union of one port per domain
(storage/ports.py): a consumer that needs one domain can be typed with its port alone.
"""

from __future__ import annotations

import importlib

from model_gateway.storage.base import (
    Account,
    AmountOverflow,
    KeyRecord,
    LimitReached,
    LogLeaf,
    PayerAddressTaken,
    ProjectRecord,
    ReceiptRecord,
    RecordNotFound,
    ReservationRecord,
    SandboxRecord,
    StateConflict,
    Storage,
    StorageError,
    TreeHeadRecord,
)
from model_gateway.storage.ports import (
    AccountsPort,
    AgentsPort,
    ClusterPort,
    ConsolePort,
    LedgerPort,
    LifecyclePort,
    LogPort,
)
from model_gateway.storage.rate_limit_port import RateLimitPort

# Import strings, so that a driver is imported only when its backend is used.
BACKENDS = {
    "sqlite": "model_gateway.storage.sqlite:SQLiteStorage",
    "postgresql": "model_gateway.storage.postgres:PostgresStorage",
    "postgres": "model_gateway.storage.postgres:PostgresStorage",
}


async def open_storage(url: str) -> Storage:
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    target = BACKENDS.get(scheme)
    if target is None:
        known = ", ".join(sorted(BACKENDS))
        raise StorageError(f"unknown storage URL scheme {scheme!r} (known: {known})")
    module_name, class_name = target.split(":")
    backend: type[Storage] = getattr(importlib.import_module(module_name), class_name)
    return await backend.open(url)


__all__ = [
    "Account",
    "AccountsPort",
    "AgentsPort",
    "AmountOverflow",
    "ClusterPort",
    "ConsolePort",
    "KeyRecord",
    "LedgerPort",
    "LifecyclePort",
    "LimitReached",
    "LogLeaf",
    "LogPort",
    "PayerAddressTaken",
    "ProjectRecord",
    "RateLimitPort",
    "ReceiptRecord",
    "RecordNotFound",
    "ReservationRecord",
    "SandboxRecord",
    "StateConflict",
    "Storage",
    "StorageError",
    "TreeHeadRecord",
    "open_storage",
]
