"""Usage, receipts, ledger and payments, as the console's JSON API."""

from __future__ import annotations

import calendar
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, TypedDict, cast

from starlette.responses import Response

from model_gateway.gateway.admin import money_admin
from model_gateway.gateway.admin.admin_views import payment_view, project_view
from model_gateway.gateway.api import receipt_view
from model_gateway.gateway.console.call import SESSION, Call, route
from model_gateway.gateway.console.guard import (
    project_of,
    require_active,
    require_owner,
)
from model_gateway.gateway.console.payload import Fields, query_cursor, query_date, query_limit
from model_gateway.gateway.console.receipt_filter import (
    filtered_receipts,
    key_prefixes,
    receipt_filter,
)
from model_gateway.gateway.console.views import ListPage, ledger_view, page
from model_gateway.gateway.json_response import json_response
from model_gateway.gateway.metering.money import format_amount
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import Conflict, InvalidRequest
from model_gateway.storage import AmountOverflow, StateConflict

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console
    from model_gateway.storage.ports import LedgerPort

_PROJECT = "/console/api/projects/{project_id}"
GROUPS = ("day", "model", "key")
# A credit refused because the balance would pass 2^63-1 micro-units (storage.MAX_AMOUNT).
BALANCE_FULL = (
    "This credit would take the project's balance past the largest amount the gateway"
    " keeps; nothing was credited."
)


def _us(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()) * 1_000_000


def month_bounds(today: date) -> tuple[date, date]:
    last = calendar.monthrange(today.year, today.month)[1]
    return today.replace(day=1), today.replace(day=last)


class UsageSums(TypedDict):
    """A row of storage's usage report: the keys LedgerPort.usage names, which it types
    `object` (counts and micro-units are integers; `group` is None for the playground's
    key, which has none)."""

    group: str | None
    requests: int
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    sandbox_ms: int
    cost: int
    cache_savings: int


class UsageRow(TypedDict):
    group: str | None
    requests: int
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    sandbox_seconds: str
    cost: str
    # What cache reads saved against the input price: informational, rounded down once
    # per row (the total is the sum of the rows).
    cache_savings: str


# `from` is a keyword: the report's range is declared by the functional syntax.
_UsageRange = TypedDict("_UsageRange", {"group_by": str, "from": str, "to": str, "total": UsageRow})


class UsageReport(ListPage[UsageRow], _UsageRange):
    """GET .../usage: a row per group, the range and its total."""


def usage_row(row: UsageSums) -> UsageRow:
    return {
        "group": row["group"],
        "requests": row["requests"],
        "input_tokens": row["input_tokens"],
        "output_tokens": row["output_tokens"],
        "cached_input_tokens": row["cached_input_tokens"],
        "cache_write_tokens": row["cache_write_tokens"],
        "reasoning_tokens": row["reasoning_tokens"],
        "sandbox_seconds": f"{row['sandbox_ms'] / 1000:.3f}",
        "cost": format_amount(row["cost"]),
        "cache_savings": format_amount(row["cache_savings"]),
    }


def usage_query(
    first: str | None, last: str | None, group_by: str | None
) -> tuple[date, date, str]:
    """The report's inclusive UTC dates (default: this month) and grouping, from the
    console's query values or the CLI's flags; a bad one is 400 naming it."""
    default_first, default_last = month_bounds(datetime.now(UTC).date())
    first_day = query_date(first, "from", default_first)
    last_day = query_date(last, "to", default_last)
    group_by = group_by or "day"
    if group_by not in GROUPS:
        raise InvalidRequest("'group_by' must be day, model or key.", param="group_by")
    if last_day < first_day:
        raise InvalidRequest("'to' is before 'from'.", param="to")
    return first_day, last_day, group_by


async def usage_report(
    storage: LedgerPort, project_id: str, first: date, last: date, group_by: str
) -> UsageReport:
    """Totals per day, model or key over the inclusive UTC dates, and over the whole range."""
    found = await storage.usage(project_id, _us(first), _us(last + timedelta(days=1)), group_by)
    rows = cast(list[UsageSums], found)
    data = [usage_row(row) for row in rows]
    total: UsageSums = {
        "group": None,
        "requests": sum(row["requests"] for row in rows),
        "input_tokens": sum(row["input_tokens"] for row in rows),
        "output_tokens": sum(row["output_tokens"] for row in rows),
        "cached_input_tokens": sum(row["cached_input_tokens"] for row in rows),
        "cache_write_tokens": sum(row["cache_write_tokens"] for row in rows),
        "reasoning_tokens": sum(row["reasoning_tokens"] for row in rows),
        "sandbox_ms": sum(row["sandbox_ms"] for row in rows),
        "cost": sum(row["cost"] for row in rows),
        "cache_savings": sum(row["cache_savings"] for row in rows),
    }
    return {
        **page(data),
        "group_by": group_by,
        "from": first.isoformat(),
        "to": last.isoformat(),
        "total": usage_row(total),
    }


def routes(console: Console) -> list[Endpoint]:
    storage, admin = console.storage, console.admin

    async def usage(call: Call) -> Response:
        found = await project_of(storage, call)
        first, last, group_by = usage_query(
            call.query("from"), call.query("to"), call.query("group_by")
        )
        return json_response(await usage_report(storage, found.id, first, last, group_by))

    async def receipts(call: Call) -> Response:
        found = await project_of(storage, call)
        limit = query_limit(call.query("limit"))
        cursor = query_cursor(call.query("cursor"))
        wanted = await receipt_filter(storage, call, found.id)
        rows, more = await filtered_receipts(storage, found.id, wanted, limit, cursor)
        keys = await key_prefixes(storage, found.id)
        data = [{**receipt_view(r), "key": keys.get(r.key_id)} for r in rows]
        return json_response(page(data, more))

    async def ledger(call: Call) -> Response:
        found = await project_of(storage, call)
        limit = query_limit(call.query("limit"))
        entries = await storage.list_ledger(found.id, limit + 1, query_cursor(call.query("cursor")))
        more = len(entries) > limit
        entries = entries[:limit]
        return json_response(
            page([ledger_view(e) for e in entries], entries[-1].id if more else None)
        )

    async def payments(call: Call) -> Response:
        user = call.session_user
        require_owner(user)
        found = await project_of(storage, call)
        fields = Fields(await call.json())
        amount = fields.amount("amount", required=True, positive=True)
        reference = fields.string("reference", required=True)
        fields.unknown()
        require_active(found)
        try:
            payment = await money_admin.record_payment(
                admin, found.id, amount, reference, user.email
            )
        except AmountOverflow:
            raise Conflict(BALANCE_FULL) from None
        except StateConflict:
            raise Conflict("A payment with this reference is already recorded.") from None
        view = await project_view(admin, found)
        return json_response({**payment_view(payment), "balance": view["balance"]}, status=201)

    return [
        route("GET", _PROJECT + "/usage", SESSION, usage),
        route("GET", _PROJECT + "/receipts", SESSION, receipts),
        route("GET", _PROJECT + "/ledger", SESSION, ledger),
        route("POST", _PROJECT + "/payments", SESSION, payments),
    ]
