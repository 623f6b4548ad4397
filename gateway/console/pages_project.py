"""A project's overview (money, limits, payment, archive) and its keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import Response

from model_gateway.gateway.access.keys import SCOPES
from model_gateway.gateway.console.api_projects import (
    ConsoleProjectView,
    key_listing_view,
    project_view,
)
from model_gateway.gateway.console.call import PAGE, Call, route
from model_gateway.gateway.console.guard import project_of
from model_gateway.gateway.console.html import (
    amount_html,
    api_form,
    esc,
    facts,
    field,
    project_page,
    short_time,
    table,
)
from model_gateway.gateway.metering.money import format_amount, parse_amount
from model_gateway.pipeline.endpoint import Endpoint

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console

_P = "/console/projects/{project_id}"


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
                ("Available", amount_html(format_amount(available))),
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
        body = summary
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
            revoke = ""
            if k["state"] == "usable":
                revoke = (
                    f'<button type="button" class="danger small"'
                    f' data-post="/console/api/keys/{esc(k["prefix"])}/revoke"'
                    f' data-confirm="Revoke {esc(k["prefix"])}? Requests with it fail at once.">'
                    "Revoke</button>"
                )
            rows.append(
                [
                    f"<code>{esc(k['prefix'])}</code>",
                    esc(k["name"] or ""),
                    esc(", ".join(k["scopes"])),
                    esc(k["state"]),
                    amount_html(k["month_spend"]),
                    amount_html(k["monthly_limit"]),
                    esc(k["rpm"] or "default"),
                    esc(k["tpm"] or "none"),
                    short_time(k["last_used_at"]) or "never",
                    revoke,
                ]
            )
        body = table(
            [
                "Prefix",
                "Name",
                "Scopes",
                "State",
                "Month spend",
                "Monthly limit",
                "Requests/min",
                "Tokens/min",
                "Last used",
                "",
            ],
            rows,
            empty="No key yet.",
        )
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
                    + field("Monthly limit (USD)", "monthly_limit", extra='inputmode="decimal"')
                    + field("Requests per minute", "rpm", kind="number", extra="min=1 data-int")
                    + field("Tokens per minute", "tpm", kind="number", extra="min=1 data-int"),
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

    return [
        route("GET", _P, PAGE, overview),
        route("GET", _P + "/keys", PAGE, keys),
    ]
