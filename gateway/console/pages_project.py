"""A project's overview (money, limits, payment, archive) and its keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from starlette.responses import Response

from model_gateway.gateway.access.keys import SCOPES
from model_gateway.gateway.console.api_money import usage_report
from model_gateway.gateway.console.api_projects import (
    ConsoleProjectView,
    KeyListingView,
    key_listing_view,
    project_view,
    visible_key,
)
from model_gateway.gateway.console.call import PAGE, Call, route
from model_gateway.gateway.console.chart import day_bars, days_between, meter
from model_gateway.gateway.console.guard import project_of, visible_project
from model_gateway.gateway.console.html import (
    amount_html,
    api_form,
    esc,
    facts,
    field,
    key_link,
    project_page,
    short_time,
    table,
    usd,
    usd_text,
)
from model_gateway.gateway.console.pages_reports import receipts_table
from model_gateway.gateway.console.receipt_filter import ReceiptFilter, filtered_receipts
from model_gateway.gateway.metering.money import parse_amount
from model_gateway.pipeline.endpoint import Endpoint

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console
    from model_gateway.storage.ports import LedgerPort

_P = "/console/projects/{project_id}"
TREND_DAYS = 14
RECENT_RECEIPTS = 10  # on a key's page
KEY_COLUMNS = [
    "Prefix",
    "Name",
    "Scopes",
    "State",
    "Month spend",
    "Monthly limit",
    "RPM",
    "TPM",
    "Expires (UTC)",
    "Last used (UTC)",
    "",
]
_PER_MINUTE = 'min=1 data-int placeholder="{}/min; empty: the project\'s"'


def _limits_form(api: str, p: ConsoleProjectView, onchain: bool) -> str:
    """What only an owner changes: budget, rpm, tpm, model policy, payer addresses."""
    return "<h2>Limits and models</h2>" + api_form(
        api,
        field(
            "Monthly budget (USD, empty: none)",
            "monthly_budget",
            value=p["monthly_budget"] or "",
        )
        + field(
            "Requests per minute (empty: default)",
            "rpm",
            kind="number",
            value=str(p["rpm"] or ""),
            extra="min=1 data-int",
        )
        + field(
            "Tokens per minute (empty: no token limit)",
            "tpm",
            kind="number",
            value=str(p["tpm"] or ""),
            extra="min=1 data-int",
        )
        + field(
            "Allowed models (comma-separated, empty: every model)",
            "allow_models",
            value=",".join(p["allow_models"] or []),
            extra="data-list",
        )
        + field(
            "Excluded models (comma-separated)",
            "exclude_models",
            value=",".join(p["exclude_models"]),
            extra="data-list",
        )
        + (
            field(
                "Payer addresses (comma-separated, for onchain purchases)",
                "payer_addresses",
                value=",".join(p["payer_addresses"]),
                extra="data-list",
            )
            if onchain
            else ""
        ),
        "Save",
        method="PATCH",
        extra="data-empty-null",
    )


def _month_against_budget(p: ConsoleProjectView) -> str:
    """This month's spend against the monthly budget, as a meter and in words."""
    spent = parse_amount(p["month_spend"], at_most=None)
    if p["monthly_budget"] is None:
        words = f"{usd(spent)} spent this month; no monthly budget."
        return f'<section class="card month"><p class="month-text">{esc(words)}</p></section>'
    budget = parse_amount(p["monthly_budget"], at_most=None)
    share = "" if budget == 0 else f" ({spent * 100 // budget}%)"
    words = f"{usd(spent)} of the {usd(budget)} monthly budget spent{share}."
    return (
        '<section class="card month">'
        + meter(spent, budget, "Spent this month against the monthly budget")
        + f'<p class="month-text">{esc(words)}</p></section>'
    )


async def _trend(storage: LedgerPort, project_id: str) -> str:
    """Requests and spend per day over the last TREND_DAYS days (UTC), today included."""
    last = datetime.now(UTC).date()
    first = last - timedelta(days=TREND_DAYS - 1)
    report = await usage_report(storage, project_id, first, last, "day")
    # A day's group is its date (only a key's may be None).
    requests = {day: r["requests"] for r in report["data"] if (day := r["group"]) is not None}
    spend = {
        day: parse_amount(r["cost"], at_most=None)
        for r in report["data"]
        if (day := r["group"]) is not None
    }
    days = days_between(first, last)
    total = report["total"]
    return (
        f'<section class="trend"><h2>Last {TREND_DAYS} days</h2>'
        f'<p class="note">{esc(total["requests"])} requests, {esc(usd_text(total["cost"]))}'
        " spent (UTC days).</p>"
        '<div class="charts"><figure><figcaption>Requests per day</figcaption>'
        + day_bars(days, requests, label="Requests per day", shown=_requests, small=True)
        + "</figure><figure><figcaption>Spend per day</figcaption>"
        + day_bars(days, spend, label="Spend per day", shown=usd, small=True)
        + "</figure></div></section>"
    )


def _requests(count: int) -> str:
    return f"{count} request" + ("" if count == 1 else "s")


def _key_limit_fields(k: KeyListingView | None) -> str:
    """The key form's limits: empty for a new key, else the key's own (a PATCH, where an
    empty field clears its limit)."""

    def shown(value: object) -> str:
        return "" if value is None else str(value)

    expires = "" if k is None or k["expires_at"] is None else k["expires_at"][:16]
    return (
        field(
            "Monthly limit",
            "monthly_limit",
            value="" if k is None or k["monthly_limit"] is None else k["monthly_limit"],
            extra='inputmode="decimal" placeholder="USD; empty: none"',
        )
        + field(
            "RPM",
            "rpm",
            kind="number",
            value=shown(k and k["rpm"]),
            extra=_PER_MINUTE.format("requests"),
        )
        + field(
            "TPM",
            "tpm",
            kind="number",
            value=shown(k and k["tpm"]),
            extra=_PER_MINUTE.format("tokens"),
        )
        + field(
            "Models",
            "models",
            value=", ".join((k and k["models"]) or []),
            extra='data-list placeholder="a, b; empty: every model"',
        )
        + field(
            "Expires at",
            "expires_at",
            kind="datetime-local",
            value=expires,
            extra='title="UTC; empty: never"',
        )
        + "<p class=\"note wide\">Empty fields: no limit of the key's own (the project's"
        " apply), every model the project allows, no expiry. Times are UTC.</p>"
    )


def _revoke_button(prefix: str, kind: str) -> str:
    return (
        f'<button type="button" class="{kind}" data-post="/console/api/keys/{esc(prefix)}/revoke"'
        f' data-confirm="Revoke {esc(prefix)}? Requests with it fail at once.">Revoke</button>'
    )


def _key_edit(k: KeyListingView, active: bool) -> str:
    """Its limits to change (the CLI's `keys update`) and revoke, while it can be used."""
    if not active:
        return ""
    return (
        "<h2>Change its limits</h2>"
        + api_form(
            f"/console/api/keys/{k['prefix']}",
            field("Name", "name", value=k["name"] or "", extra="maxlength=200")
            + _key_limit_fields(k),
            "Save",
            method="PATCH",
            extra="data-empty-null",
        )
        + '<h2>Revoke</h2><p class="note">Requests with it fail from the next one on.</p>'
        + _revoke_button(k["prefix"], "danger")
    )


def _key_facts(k: KeyListingView) -> str:
    spent = parse_amount(k["month_spend"], at_most=None)
    if k["monthly_limit"] is None:
        month = f'<p class="month-text">{esc(usd(spent))} spent this month; no monthly limit.</p>'
    else:
        limit = parse_amount(k["monthly_limit"], at_most=None)
        month = meter(spent, limit, "Spent this month against the key's monthly limit") + (
            f'<p class="month-text">{esc(usd(spent))} of its {esc(usd(limit))} monthly limit'
            " spent this month.</p>"
        )
    return f'<section class="card month">{month}</section>' + facts(
        [
            ("State", esc(k["state"])),
            ("Scopes", esc(", ".join(k["scopes"]))),
            ("Models", esc(", ".join(k["models"] or []) or "every model the project allows")),
            ("Monthly limit", amount_html(k["monthly_limit"])),
            ("Spent this month", amount_html(k["month_spend"])),
            ("RPM", esc(k["rpm"] or "the project's")),
            ("TPM", esc(k["tpm"] or "the project's")),
            ("Expires at (UTC)", short_time(k["expires_at"]) or "never"),
            ("Created (UTC)", short_time(k["created_at"])),
            ("Last used (UTC)", short_time(k["last_used_at"]) or "never"),
        ]
    )


def routes(console: Console) -> list[Endpoint]:
    storage = console.storage

    async def overview(call: Call) -> Response:
        project = await project_of(storage, call)
        p = await project_view(console.admin, project)
        onchain = console.config.purchases is not None
        stored = {name: parse_amount(p[name], at_most=None) for name in ("balance", "reserved")}
        available = stored["balance"] - stored["reserved"]
        summary = facts(
            [
                ("Balance", amount_html(p["balance"])),
                ("Reserved", amount_html(p["reserved"])),
                ("Available", esc(usd(available))),
                ("Monthly budget", amount_html(p["monthly_budget"])),
                ("Spent this month", amount_html(p["month_spend"])),
                ("Requests per minute", esc(p["rpm"] or "default")),
                ("Tokens per minute", esc(p["tpm"] or "no limit")),
                ("Allowed models", esc(", ".join(p["allow_models"] or []) or "every model")),
                ("Excluded models", esc(", ".join(p["exclude_models"]) or "none")),
            ]
            + (
                [("Payer addresses", esc(", ".join(p["payer_addresses"]) or "none"))]
                if onchain
                else []
            )
        )
        body = _month_against_budget(p) + await _trend(storage, project.id) + summary
        if project.state == "active":
            api = f"/console/api/projects/{project.id}"
            if onchain:
                body += "<h2>Credit an onchain purchase</h2>" + api_form(
                    api + "/purchases",
                    field(
                        "Transaction hash", "tx_hash", extra='required pattern="0x[0-9a-fA-F]{64}"'
                    ),
                    "Check and credit",
                )
            # Members read the limits above; owners change them.
            if call.session_user.role == "owner":
                body += _limits_form(api, p, onchain)
                body += "<h2>Record a payment</h2>" + api_form(
                    api + "/payments",
                    field("Amount (USD)", "amount", extra='required inputmode="decimal"')
                    + field("Reference (invoice, transfer)", "reference", extra="required"),
                    "Record payment",
                    extra='data-confirm="Credit this payment to the project?"',
                )
                body += (
                    '<h2>Archive</h2><p class="note">Its keys stop working at once; '
                    "the project becomes read-only.</p>"
                    f'<button type="button" class="danger" data-post="{api}/archive"'
                    ' data-confirm="Archive this project? Its keys stop working.">'
                    "Archive project</button>"
                )
        return project_page("Overview", project, "", body, user=call.user)

    async def keys(call: Call) -> Response:
        project = await project_of(storage, call)
        rows: list[list[str]] = []
        for listing in await storage.list_keys(project.id):
            k = await key_listing_view(console.admin, listing)
            revoke = _revoke_button(k["prefix"], "danger small") if k["state"] == "usable" else ""
            rows.append(
                [
                    key_link(k["prefix"]),
                    esc(k["name"] or ""),
                    esc(", ".join(k["scopes"])),
                    esc(k["state"]),
                    amount_html(k["month_spend"]),
                    amount_html(k["monthly_limit"]),
                    esc(k["rpm"] or "default"),
                    esc(k["tpm"] or "none"),
                    short_time(k["expires_at"]) or "never",
                    short_time(k["last_used_at"]) or "never",
                    revoke,
                ]
            )
        body = table(KEY_COLUMNS, rows, empty="No key yet.")
        if project.state == "active":
            scopes = "".join(
                f'<label class="check"><input type="checkbox" name="scopes" value="{s}"'
                f"{' checked' if s == 'inference' else ''}> {s}</label>"
                for s in sorted(SCOPES)
            )
            body += (
                "<h2>New key</h2>"
                + api_form(
                    f"/console/api/projects/{project.id}/keys",
                    field("Name", "name")
                    + f"<fieldset><legend>Scopes</legend>{scopes}</fieldset>"
                    + _key_limit_fields(None),
                    "Create key",
                    extra='data-reveal="key"',
                )
                + '<section id="reveal" class="card reveal" hidden>'
                "<h2>Your new key</h2><p>Copy it now: it is shown only this once.</p>"
                '<div class="secret"><code id="reveal-value"></code>'
                '<button type="button" data-copy="reveal-value">Copy</button></div>'
                '<p class="copied" hidden>Copied.</p>'
                '<p><a href="">Done</a></p></section>'
            )
        return project_page("Keys", project, "keys", body, user=call.user)

    async def key(call: Call) -> Response:
        listing = await visible_key(console.admin, call.session_user, call.params["prefix"])
        project = await visible_project(storage, call.session_user, listing.key.project_id)
        k = await key_listing_view(console.admin, listing)
        recent, _ = await filtered_receipts(
            storage, project.id, ReceiptFilter(key_id=listing.key.id), RECENT_RECEIPTS, None
        )
        all_receipts = f"/console/projects/{project.id}/receipts?" + urlencode({"key": k["prefix"]})
        body = (
            f'<p class="crumbs"><a href="/console/projects/{esc(project.id)}/keys">Keys</a> /</p>'
            f"<h2>Key <code>{esc(k['prefix'])}</code> {esc(k['name'] or '')}</h2>"
            + _key_facts(k)
            + "<h2>Recent receipts</h2>"
            + receipts_table(recent, None, empty="No receipt yet.")
            + f'<p class="more"><a href="{esc(all_receipts)}">All receipts of this key</a></p>'
            + (_key_edit(k, project.state == "active") if k["state"] != "revoked" else "")
        )
        return project_page(f"Key {k['prefix']}", project, "keys", body, user=call.user)

    return [
        route("GET", _P, PAGE, overview),
        route("GET", _P + "/keys", PAGE, keys),
        route("GET", "/console/keys/{prefix}", PAGE, key),
    ]
