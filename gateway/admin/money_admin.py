"""Money an operator adds to a project: development credit, recorded payments, and onchain
purchases once verified; each with its audit entry (credit.add, payment.record,
purchase.credit), whose target is the project credited. Amounts are int micro-units."""

from __future__ import annotations

from model_gateway.gateway.admin.admin_context import AdminContext, InvalidChange, NotPermitted
from model_gateway.gateway.admin.audit_trail import audit_entry, target
from model_gateway.storage import RecordNotFound, StateConflict
from model_gateway.storage.base import PaymentRecord, ProjectRecord, PurchaseRecord, new_id, now_s


def check_credit_permitted(admin: AdminContext) -> None:
    """Development credit exists outside production only (NotPermitted)."""
    if admin.production:
        raise NotPermitted("development credit is not permitted in production")


async def active_project(admin: AdminContext, project_id: str) -> ProjectRecord:
    """The project, if it exists and is not archived: credit and keys are for live ones."""
    project = await admin.storage.get_project(project_id)
    if project is None:
        raise RecordNotFound(f"no project {project_id}")
    if project.state == "archived":
        raise StateConflict(f"project {project_id} is archived")
    return project


async def add_credit(admin: AdminContext, project_id: str, amount: int) -> ProjectRecord:
    """Development credit to an active project (NotPermitted in production; RecordNotFound,
    StateConflict, AmountOverflow). The project credited."""
    check_credit_permitted(admin)
    project = await active_project(admin, project_id)
    audit = audit_entry(admin, "credit.add", target("project", project_id), {"amount": amount})
    await admin.storage.add_credit(project_id, amount, admin.month(), audit)
    return project


async def record_payment(
    admin: AdminContext, project_id: str, amount: int, reference: str, recorded_by: str | None
) -> PaymentRecord:
    """Credit money that arrived by other means, once per reference (StateConflict)."""
    if amount <= 0:
        raise InvalidChange("a payment must be more than zero")
    payment = PaymentRecord(
        id=new_id("pay"),
        project_id=project_id,
        reference=reference,
        amount=amount,
        month=admin.month(),
        recorded_by=recorded_by,
        created_at=now_s(),
    )
    audit = audit_entry(
        admin,
        "payment.record",
        target("project", project_id),
        {"payment": payment.id, "amount": amount, "reference": reference},
    )
    return await admin.storage.record_payment(payment, audit)


async def credit_purchase(admin: AdminContext, purchase: PurchaseRecord) -> PurchaseRecord:
    """Credit a verified onchain transfer, once per transaction (StateConflict,
    AmountOverflow)."""
    p = purchase
    audit = audit_entry(
        admin,
        "purchase.credit",
        target("project", p.project_id),
        # Token units may pass 64 bits: a decimal string, as the console shows them.
        {
            "tx_hash": p.tx_hash,
            "sender": p.sender,
            "token_units": str(p.token_units),
            "amount": p.amount,
        },
    )
    return await admin.storage.record_purchase(purchase, audit)
