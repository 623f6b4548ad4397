"""What the console shows of its records: amounts as decimal strings, times as RFC 3339 UTC."""

from __future__ import annotations

from datetime import UTC, datetime

from model_gateway.gateway.money import format_amount
from model_gateway.storage.base import LedgerEntry, PaymentRecord, UserRecord


def iso(seconds: int | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def user_view(user: UserRecord, projects: list[str] | None = None) -> dict:
    """Never the password hash."""
    view = {
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


def ledger_view(entry: LedgerEntry) -> dict:
    return {
        "id": entry.id,
        "object": "ledger_entry",
        "kind": entry.kind,
        "amount": format_amount(entry.amount),
        "receipt_id": entry.receipt_id,
        "key_id": entry.key_id,
        "reference": entry.reference,
        "created_at": iso(entry.created_at),
    }


def payment_view(payment: PaymentRecord) -> dict:
    return {
        "id": payment.id,
        "object": "payment",
        "project": payment.project_id,
        "amount": format_amount(payment.amount),
        "reference": payment.reference,
        "recorded_by": payment.recorded_by,
        "created_at": iso(payment.created_at),
    }


def page(data: list, next_cursor: int | None = None) -> dict:
    return {
        "object": "list",
        "data": data,
        "next_cursor": None if next_cursor is None else str(next_cursor),
    }
