"""A project's usage (with its chart), receipts and ledger."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from starlette.responses import Response

from model_gateway.gateway.console.api_money import UsageReport, month_bounds, usage_report
from model_gateway.gateway.console.call import PAGE, Call, route
from model_gateway.gateway.console.chart import cost_chart
from model_gateway.gateway.console.guard import project_of
from model_gateway.gateway.console.html import (
    amount_html,
    esc,
    facts,
    field,
    key_link,
    older_link,
    project_page,
    short_time,
    table,
    usd,
    usd_text,
)
from model_gateway.gateway.console.payload import query_cursor, query_date
from model_gateway.gateway.console.receipt_filter import (
    STATUSES,
    ReceiptFilter,
    filtered_receipts,
    receipt_filter,
)
from model_gateway.gateway.console.views import ledger_view
from model_gateway.gateway.metering.money import parse_amount
from model_gateway.pipeline.endpoint import Endpoint

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console
    from model_gateway.storage.base import KeyListing, ReceiptRecord

_P = "/console/projects/{project_id}"
MAX_DAYS = 366  # the usage page's chart: a bar a day


def _issued_minute(created_at_us: int) -> str:
    """A receipt's time to the minute, UTC, as short_time shows its view's created_at."""
    return datetime.fromtimestamp(created_at_us / 1_000_000, UTC).strftime("%Y-%m-%d %H:%M")


RECEIPT_COLUMNS = ["Time (UTC)", "Receipt", "Endpoint", "Model", "Key", "Status", "Usage", "Cost"]


def receipts_table(
    found: list[ReceiptRecord], keys: dict[str | None, str] | None, *, empty: str
) -> str:
    """Receipts newest first, each linking to its public proof; `keys` names their keys
    (None: one key's own list, without the column)."""
    rows: list[list[str]] = []
    for record in found:
        usage = record.usage
        cached = usage.get("cached_input_tokens", 0)
        amount = (
            f"{usage.get('input_tokens', 0)} in"
            + (f" ({cached} cached)" if cached else "")
            + f" / {usage.get('output_tokens', 0)} out"
            if record.kind == "inference"
            else f"{usage.get('duration_ms', 0)} ms"
        )
        row = [
            f'<span class="nowrap">{esc(_issued_minute(record.created_at))}</span>',
            f'<a href="/proofs/{esc(record.id)}"><code>{esc(record.id)}</code></a>',
            f"<code>{esc(record.endpoint)}</code>",
            esc(record.model_or_runtime),
            esc(record.status),
            f'<span class="nowrap">{esc(amount)}</span>',
            f'<span class="num">{esc(usd(record.cost))}</span>',
        ]
        if keys is not None:
            key = keys.get(record.key_id)
            row.insert(4, key_link(key) if key else "none (console)")
        rows.append(row)
    columns = RECEIPT_COLUMNS if keys is not None else [c for c in RECEIPT_COLUMNS if c != "Key"]
    return table(columns, rows, empty=empty)


def _filter_form(
    wanted: ReceiptFilter, listings: list[KeyListing], models: list[str], path: str
) -> str:
    """A GET form: the filters travel in the URL (shareable; back and forward work)."""

    def options(values: list[tuple[str, str]], chosen: str | None) -> str:
        return '<option value="">Any</option>' + "".join(
            f'<option value="{esc(v)}"{" selected" if v == chosen else ""}>{esc(text)}</option>'
            for v, text in values
        )

    keys = [(x.key.prefix, x.key.prefix + (f" ({x.name})" if x.name else "")) for x in listings]
    statuses = [(s, s) for s in STATUSES]
    model_list = "".join(f'<option value="{esc(m)}"></option>' for m in models)
    first = "" if wanted.first is None else wanted.first.isoformat()
    last = "" if wanted.last is None else wanted.last.isoformat()
    return (
        f'<form class="filters card" method="get" action="{esc(path)}" data-clean-query>'
        + field("Model", "model", value=wanted.model or "", extra='list="model-list"')
        + f'<datalist id="model-list">{model_list}</datalist>'
        # aria-label: a label's text would name the select with its chosen option too.
        + '<label>Key<select name="key" aria-label="Key">'
        + f"{options(keys, wanted.key_prefix)}</select></label>"
        + '<label>Status<select name="status" aria-label="Status">'
        + f"{options(statuses, wanted.status)}</select></label>"
        + field("From", "from", kind="date", value=first)
        + field("To", "to", kind="date", value=last)
        + '<div class="actions"><button type="submit">Filter</button>'
        f' <a class="clear" href="{esc(path)}">Clear filters</a></div></form>'
    )


def routes(console: Console) -> list[Endpoint]:
    storage, catalog = console.storage, console.gateway.catalog

    async def usage(call: Call) -> Response:
        project = await project_of(storage, call)
        default_first, default_last = month_bounds(datetime.now(UTC).date())
        first = query_date(call.query("from"), "from", default_first)
        last = query_date(call.query("to"), "to", default_last)
        notice = ""
        if last < first or (last - first).days > MAX_DAYS:
            # Said on the page, never silently: the chart shows another range than asked.
            why = "'From' is after 'To'" if last < first else f"The range is over {MAX_DAYS} days"
            notice = f'<p class="error-text" role="alert">{why}: showing this month instead.</p>'
            first, last = default_first, default_last
        by_day = await usage_report(storage, project.id, first, last, "day")
        by_model = await usage_report(storage, project.id, first, last, "model")
        by_key = await usage_report(storage, project.id, first, last, "key")
        cost = {
            row["group"]: parse_amount(row["cost"], at_most=None)
            for row in by_day["data"]
            if row["group"] is not None  # a day's group is a date: only a key's may be None
        }
        total = by_day["total"]

        def rows(report: UsageReport, label: Callable[[str | None], str]) -> list[list[str]]:
            return [
                [
                    label(r["group"]),
                    esc(r["requests"]),
                    esc(r["input_tokens"]),
                    esc(r["cached_input_tokens"]),
                    esc(r["output_tokens"]),
                    esc(r["sandbox_seconds"]),
                    amount_html(r["cost"]),
                    amount_html(r["cache_savings"]),
                ]
                for r in report["data"]
            ]

        heads = [
            "",
            "Requests",
            "Input tokens",
            "Cached",
            "Output tokens",
            "Sandbox s",
            "Cost",
            "Cache savings",
        ]
        body = (
            '<form class="range" method="get">'
            + field("From", "from", kind="date", value=first.isoformat())
            + field("To", "to", kind="date", value=last.isoformat())
            + '<button type="submit">Show</button></form>'
            + notice
            + facts(
                [
                    ("Cost", amount_html(total["cost"])),
                    ("Requests", esc(total["requests"])),
                    ("Input tokens", esc(total["input_tokens"])),
                    ("Output tokens", esc(total["output_tokens"])),
                    ("Cached input tokens", esc(total["cached_input_tokens"])),
                    ("Cache savings", amount_html(total["cache_savings"])),
                ]
            )
            + '<p class="note">Input tokens include cached ones. Cache savings: how much less'
            " cache reads cost than uncached input at the prices applied (the cost already"
            " reflects it), rounded down per row; informational.</p>"
            + "<h2>Cost per day</h2>"
            + cost_chart(first, last, cost)
            + "<h2>Per model</h2>"
            + table(
                ["Model", *heads[1:]],
                rows(by_model, lambda g: f"<code>{esc(g)}</code>"),
                empty="No usage in this range.",
            )
            + "<h2>Per key</h2>"
            + table(
                ["Key", *heads[1:]],
                rows(by_key, lambda g: f"<code>{esc(g)}</code>" if g else "console playground"),
                empty="No usage in this range.",
            )
        )
        return project_page("Usage", project, "usage", body, user=call.user)

    async def receipts(call: Call) -> Response:
        project = await project_of(storage, call)
        cursor = query_cursor(call.query("cursor"))
        wanted = await receipt_filter(storage, call, project.id)
        found, more = await filtered_receipts(storage, project.id, wanted, 50, cursor)
        listings = await storage.list_keys(project.id)
        keys: dict[str | None, str] = {x.key.id: x.key.prefix for x in listings}
        path = f"/console/projects/{project.id}/receipts"
        filtering = wanted.active
        body = (
            _filter_form(wanted, listings, [m for m, _ in catalog.visible_to(None, project)], path)
            + '<p class="note">Each receipt links to its public proof page.</p>'
            + receipts_table(
                found,
                keys,
                empty="No receipt matches these filters." if filtering else "No receipt yet.",
            )
            + older_link(path, None if more is None else str(more), wanted.query())
        )
        return project_page("Receipts", project, "receipts", body, user=call.user)

    async def ledger(call: Call) -> Response:
        project = await project_of(storage, call)
        found = await storage.list_ledger(project.id, 51, query_cursor(call.query("cursor")))
        more = str(found[49].id) if len(found) > 50 else None  # as for receipts
        rows: list[list[str]] = []
        for entry in found[:50]:
            e = ledger_view(entry)
            sign = "&minus;" if e["kind"] == "charge" else "+"
            detail = e["reference"] or e["receipt_id"] or ""
            rows.append(
                [
                    short_time(e["created_at"]),
                    esc(e["kind"]),
                    f'<span class="num">{sign}{esc(usd_text(e["amount"]))}</span>',
                    f"<code>{esc(detail)}</code>",
                ]
            )
        body = table(
            ["Time (UTC)", "Kind", "Amount", "Reference or receipt"], rows, empty="No entry yet."
        )
        body += older_link(f"/console/projects/{project.id}/ledger", more)
        return project_page("Ledger", project, "ledger", body, user=call.user)

    return [
        route("GET", _P + "/usage", PAGE, usage),
        route("GET", _P + "/receipts", PAGE, receipts),
        route("GET", _P + "/ledger", PAGE, ledger),
    ]
