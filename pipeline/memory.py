"""In-memory implementations of the ports, for tests and for hosts without a database.

They follow the same contracts as the gateway's storage-backed ones (one contract suite
runs against both): one process, state lost on exit.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.errors import (
    BudgetExceeded,
    Forbidden,
    InsufficientBalance,
    InvalidApiKey,
)
from model_gateway.pipeline.ports import (
    FallbackInfo,
    KeyInfo,
    ModelInfo,
    ProjectInfo,
    Reserved,
)


@dataclass(frozen=True, slots=True)
class Key:
    id: str
    project_id: str
    scopes: frozenset[str]
    models: list[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    monthly_limit: int | None = None  # micro-units
    revoked: bool = False


@dataclass(slots=True)
class Project:
    id: str
    rpm: int | None = None
    tpm: int | None = None
    allow_models: list[str] | None = None
    exclude_models: list[str] = field(default_factory=list)
    archived: bool = False
    balance: int = 0  # micro-units
    monthly_budget: int | None = None
    month_spend: int = 0


class MemoryKeys:
    """`KeyLookup` over a dict of presented keys."""

    def __init__(self, projects: Mapping[str, Project], keys: Mapping[str, Key]) -> None:
        self.projects = projects
        self.keys = keys

    async def authenticate(self, presented: str) -> tuple[KeyInfo, ProjectInfo]:
        key = self.keys.get(presented)
        if key is None or key.revoked:
            raise InvalidApiKey()
        project = self.projects[key.project_id]
        if project.archived:
            raise Forbidden("The key's project is archived.")
        return key, project


@dataclass(frozen=True, slots=True)
class MemoryReservation:
    id: str
    project_id: str
    key_id: str | None
    amount: int


class MemoryMeter:
    """`Meter` over the projects' balances and budgets and the keys' monthly limits."""

    def __init__(self, projects: Mapping[str, Project], keys: Mapping[str, Key]) -> None:
        self.projects = projects
        self.key_limits = {key.id: key.monthly_limit for key in keys.values()}
        self.key_spend: dict[str, int] = {}
        self.open: dict[str, MemoryReservation] = {}
        self.receipts: list[Settlement] = []

    def reserved(self, project_id: str) -> int:
        return sum(r.amount for r in self.open.values() if r.project_id == project_id)

    def _key_held(self, key_id: str) -> int:
        return sum(r.amount for r in self.open.values() if r.key_id == key_id)

    async def reserve(
        self, project_id: str, key_id: str | None, amount: int, *, watched: bool = False
    ) -> Reserved:
        project = self.projects[project_id]
        limit = self.key_limits.get(key_id) if key_id is not None else None
        if limit is not None and key_id is not None:
            if self.key_spend.get(key_id, 0) + self._key_held(key_id) + amount > limit:
                raise BudgetExceeded("The request would exceed the key's monthly limit.")
        reserved = self.reserved(project_id)
        budget = project.monthly_budget
        if budget is not None and project.month_spend + reserved + amount > budget:
            raise BudgetExceeded("The request would exceed the project's monthly budget.")
        if project.balance - reserved < amount:
            raise InsufficientBalance()
        reservation = MemoryReservation("rsv_" + secrets.token_hex(8), project_id, key_id, amount)
        self.open[reservation.id] = reservation
        return reservation

    async def settle(self, reservation: Reserved, settlement: Settlement) -> None:
        held = self.open.pop(reservation.id, None)
        if held is None:
            raise LookupError(f"reservation {reservation.id} is not open")
        cost = min(settlement.cost, held.amount)
        project = self.projects[held.project_id]
        project.balance -= cost
        project.month_spend += cost
        if held.key_id is not None:
            self.key_spend[held.key_id] = self.key_spend.get(held.key_id, 0) + cost
        self.receipts.append(settlement)

    async def release(self, reservation: Reserved) -> None:
        self.open.pop(reservation.id, None)


@dataclass(frozen=True, slots=True)
class Model:
    supports_tools: bool = True
    available: bool = True
    mode: str = "chat"
    # What the gateway's inference endpoints read (ports.ModelInfo); a host's own ignore them.
    input_price_per_mtok: int | None = None
    output_price_per_mtok: int | None = None
    max_output_tokens: int = 4096
    provider: str = ""
    upstream: str | None = None
    fallbacks: tuple[FallbackInfo, ...] = ()


class StaticCatalog:
    """`ModelCatalog` over a fixed dict of models."""

    def __init__(self, models: Mapping[str, Model]) -> None:
        self.models = models

    def resolve(self, name: str) -> tuple[str, ModelInfo] | None:
        model = self.models.get(name)
        return None if model is None else (name, model)

    def available(self, model: ModelInfo) -> bool:
        return getattr(model, "available", True)
