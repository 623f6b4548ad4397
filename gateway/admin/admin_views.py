"""Records as the CLI's JSON and the console's JSON show them: amounts as decimal strings,
times as RFC 3339 UTC, never a key, a key's hash or a password hash."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import NotRequired, TypedDict

from model_gateway.gateway.admin.admin_context import AdminContext
from model_gateway.gateway.cluster.admin_confirm import Confirmation
from model_gateway.gateway.metering.money import format_amount
from model_gateway.storage.base import (
    AuditEntry,
    KeyRecord,
    PaymentRecord,
    ProjectRecord,
    SandboxRecord,
    UserRecord,
    now_s,
)


def iso(seconds: int | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def optional_amount(micros: int | None) -> str | None:
    return None if micros is None else format_amount(micros)


class ProjectView(TypedDict):
    id: str
    name: str
    state: str
    balance: str
    monthly_budget: str | None
    month_spend: str
    reserved: str
    leased: str
    rpm: int | None
    tpm: int | None
    allow_models: list[str] | None
    exclude_models: list[str]
    created_at: str | None


class KeyView(TypedDict):
    id: str
    prefix: str
    project: str
    scopes: list[str]
    models: list[str] | None
    monthly_limit: str | None
    month_spend: str
    expires_at: str | None
    rpm: int | None
    tpm: int | None
    state: str  # usable | revoked | expired
    created_at: str | None


class SandboxView(TypedDict):
    id: str
    object: str
    project: str
    runtime: str
    timeout_s: int
    memory_mb: int
    created_at: str | None


class UserView(TypedDict):
    id: str
    object: str
    email: str
    role: str
    disabled: bool
    created_at: str | None
    projects: NotRequired[list[str]]


class AuditView(TypedDict):
    id: str
    object: str
    at: str | None
    actor: str
    action: str
    target: dict[str, str]
    changes: dict[str, object]
    request_id: str | None


class PaymentView(TypedDict):
    id: str
    object: str
    project: str
    amount: str
    reference: str
    recorded_by: str | None
    created_at: str | None


async def project_view(admin: AdminContext, project: ProjectRecord) -> ProjectView:
    account = await admin.storage.project_account(project.id, admin.month())
    return {
        "id": project.id,
        "name": project.name,
        "state": project.state,
        "balance": format_amount(account.balance),
        "monthly_budget": optional_amount(project.monthly_budget),
        "month_spend": format_amount(account.month_spend),
        "reserved": format_amount(account.reserved),
        "leased": format_amount(account.leased),
        "rpm": project.rpm,
        "tpm": project.tpm,
        "allow_models": project.allow_models,
        "exclude_models": project.exclude_models,
        "created_at": iso(project.created_at),
    }


async def key_view(admin: AdminContext, key: KeyRecord) -> KeyView:
    expired = key.expires_at is not None and key.expires_at <= now_s()
    return {
        "id": key.id,
        "prefix": key.prefix,
        "project": key.project_id,
        "scopes": sorted(key.scopes),
        "models": key.models,
        "monthly_limit": optional_amount(key.monthly_limit),
        "month_spend": format_amount(await admin.storage.key_month_spend(key.id, admin.month())),
        "expires_at": iso(key.expires_at),
        "rpm": key.rpm,
        "tpm": key.tpm,
        "state": "expired" if key.state == "usable" and expired else key.state,
        "created_at": iso(key.created_at),
    }


def sandbox_view(sandbox: SandboxRecord) -> SandboxView:
    return {
        "id": sandbox.id,
        "object": "sandbox",
        "project": sandbox.project_id,
        "runtime": sandbox.runtime,
        "timeout_s": sandbox.timeout_s,
        "memory_mb": sandbox.memory_mb,
        "created_at": iso(sandbox.created_at),
    }


def user_view(user: UserRecord, projects: list[str] | None = None) -> UserView:
    """Never the password hash."""
    view: UserView = {
        "id": user.id,
        "object": "user",
        "email": user.email,
        "role": user.role,
        "disabled": user.disabled,
        "created_at": iso(user.created_at),
    }
    if projects is not None:
        view["projects"] = projects
    return view


def payment_view(payment: PaymentRecord) -> PaymentView:
    return {
        "id": payment.id,
        "object": "payment",
        "project": payment.project_id,
        "amount": format_amount(payment.amount),
        "reference": payment.reference,
        "recorded_by": payment.recorded_by,
        "created_at": iso(payment.created_at),
    }


def audit_view(entry: AuditEntry) -> AuditView:
    return {
        "id": entry.id,
        "object": "audit_entry",
        "at": iso(entry.at),
        "actor": entry.actor,
        "action": entry.action,
        "target": entry.target,
        "changes": entry.changes,
        "request_id": entry.request_id,
    }


def with_instances(view: Mapping[str, object], confirmation: Confirmation) -> dict[str, object]:
    """A changed record's view with `instances`: which live instances dropped the change."""
    return {**view, "instances": confirmation.view()}
