"""What the console alone shows of its records: ledger entries, and list pages. Amounts are
decimal strings, times RFC 3339 UTC; the views the CLI shares are gateway/admin/admin_views.py."""

from __future__ import annotations

from typing import Generic, TypedDict, TypeVar

from model_gateway.gateway.admin.admin_views import iso
from model_gateway.gateway.metering.money import format_amount
from model_gateway.storage.base import LedgerEntry

T = TypeVar("T")


class LedgerView(TypedDict):
    id: int
    object: str
    kind: str
    amount: str
    receipt_id: str | None
    key_id: str | None
    reference: str | None
    created_at: str | None


class ListPage(TypedDict, Generic[T]):
    object: str
    data: list[T]
    next_cursor: str | None


def ledger_view(entry: LedgerEntry) -> LedgerView:
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


def page(data: list[T], next_cursor: int | None = None) -> ListPage[T]:
    return {
        "object": "list",
        "data": data,
        "next_cursor": None if next_cursor is None else str(next_cursor),
    }
