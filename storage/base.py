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
