"""Projects: create, update (limits, model policy, payer addresses), archive; each with its
audit entry (project.create, project.update, project.archive)."""

from __future__ import annotations

from typing import TypedDict

from model_gateway.gateway.admin.admin_context import (
    AdminContext,
    ConfirmedChange,
    check_tpm,
    confirmed,
)
from model_gateway.gateway.admin.audit_trail import audit_entry, given, target
from model_gateway.gateway.admin.money_admin import add_credit, check_credit_permitted
from model_gateway.storage.base import ProjectRecord, new_id, now_s


class ProjectLimits(TypedDict, total=False):
    """A project's limits and model policy; a present None clears an optional limit."""

    monthly_budget: int | None
    rpm: int | None
    tpm: int | None
    allow_models: list[str] | None
    exclude_models: list[str] | None  # None: no exclusions


class ProjectChanges(ProjectLimits, total=False):
    """The fields to change: the limits, and the name (which members may change too)."""

    name: str


async def create_project(
    admin: AdminContext,
    *,
    name: str,
    monthly_budget: int | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    allow_models: list[str] | None = None,
    exclude_models: list[str] | None = None,
    balance: int | None = None,
) -> ProjectRecord:
    """A new active project; a `balance` is development credit (NotPermitted in
    production, refused before the project exists: never half-made), a change of its own
    (credit.add)."""
    check_tpm(tpm)
    if balance:
        check_credit_permitted(admin)
    project = ProjectRecord(
        id=new_id("prj"),
        name=name,
        monthly_budget=monthly_budget,
        rpm=rpm,
        tpm=tpm,
        allow_models=allow_models,
        exclude_models=exclude_models or [],
        created_at=now_s(),
    )
    fields = given(
        name=name,
        monthly_budget=monthly_budget,
        rpm=rpm,
        tpm=tpm,
        allow_models=allow_models,
        exclude_models=exclude_models,
    )
    audit = audit_entry(admin, "project.create", target("project", project.id), fields)
    await admin.storage.create_project(project, audit)
    if balance:
        await add_credit(admin, project.id, balance)
    return project


async def update_project(
    admin: AdminContext,
    project_id: str,
    changes: ProjectChanges,
    *,
    payer_addresses: list[str] | None = None,
) -> ConfirmedChange[ProjectRecord]:
    """Change an active project (RecordNotFound, StateConflict when archived); the payer
    addresses first (None: unchanged), so that one another project holds refuses the
    whole change (PayerAddressTaken). Each part is recorded with its own write (two
    project.update entries when both change)."""
    fields: dict[str, object] = dict(changes)
    check_tpm(fields.get("tpm"))
    if "exclude_models" in fields and fields["exclude_models"] is None:
        fields["exclude_models"] = []
    about = target("project", project_id)
    if payer_addresses is not None:
        payers = audit_entry(admin, "project.update", about, {"payer_addresses": payer_addresses})
        await admin.storage.set_payer_addresses(project_id, payer_addresses, payers)
    audit = audit_entry(admin, "project.update", about, fields) if fields else None
    return await confirmed(admin, await admin.storage.update_project(project_id, fields, audit))


async def archive_project(admin: AdminContext, project_id: str) -> ConfirmedChange[ProjectRecord]:
    """Archive an active project: its keys stop working (RecordNotFound, StateConflict)."""
    audit = audit_entry(
        admin, "project.archive", target("project", project_id), {"state": "archived"}
    )
    return await confirmed(admin, await admin.storage.archive_project(project_id, audit))
