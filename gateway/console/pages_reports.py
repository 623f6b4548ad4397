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
    older_link,
    project_page,
    short_time,
    table,
)
from model_gateway.gateway.console.payload import query_cursor, query_date
from model_gateway.gateway.console.views import ledger_view
from model_gateway.gateway.metering.money import format_amount, parse_amount
from model_gateway.pipeline.endpoint import Endpoint

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console

_P = "/console/projects/{project_id}"
MAX_DAYS = 366  # the usage page's chart: a bar a day


def _issued_minute(created_at_us: int) -> str:
    """A receipt's time to the minute, UTC, as short_time shows its view's created_at."""
    return datetime.fromtimestamp(created_at_us / 1_000_000, UTC).strftime("%Y-%m-%d %H:%M")


def routes(console: Console) -> list[Endpoint]:
    storage = console.storage

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
            + "<h2>Cost per day (USD)</h2>"
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
        found = await storage.list_receipts(project.id, 51, query_cursor(call.query("cursor")))
        # Older: those before the last one shown (as the JSON API's next_cursor).
        more = found[49][0] if len(found) > 50 else None
        rows: list[list[str]] = []
        for _, record in found[:50]:
            usage = record.usage
            cached = usage.get("cached_input_tokens", 0)
            amount = (
                f"{usage.get('input_tokens', 0)} in"
                + (f" ({cached} cached)" if cached else "")
                + f" / {usage.get('output_tokens', 0)} out"
                if record.kind == "inference"
                else f"{usage.get('duration_ms', 0)} ms"
            )
            rows.append(
                [
                    esc(_issued_minute(record.created_at)),
                    f'<a href="/proofs/{esc(record.id)}"><code>{esc(record.id)}</code></a>',
                    f"<code>{esc(record.endpoint)}</code>",
                    esc(record.model_or_runtime),
                    esc(record.status),
                    esc(amount),
                    amount_html(format_amount(record.cost)),
                ]
            )
        body = (
            '<p class="note">Each receipt links to its public proof page.</p>'
            + table(
                ["Time (UTC)", "Receipt", "Endpoint", "Model", "Status", "Usage", "Cost"],
                rows,
                empty="No receipt yet.",
            )
            + older_link(
                f"/console/projects/{project.id}/receipts", None if more is None else str(more)
            )
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
                    f'<span class="num">{sign}{esc(e["amount"])}</span>',
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
