"""The audit log's page, for owners: newest first, filtered by action and actor (the
filters in the URL's query, so a filtered view can be shared), older entries a link away.
A plain GET form: it works without JavaScript."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlencode

import orjson
from starlette.responses import Response

from model_gateway.gateway.console.api_audit import ACTIONS, audit_asked
from model_gateway.gateway.console.call import PAGE, Call, route
from model_gateway.gateway.console.html import esc, field, page, short_time, table
from model_gateway.pipeline.endpoint import Endpoint

if TYPE_CHECKING:
    from model_gateway.gateway.admin.admin_views import AuditView
    from model_gateway.gateway.console.mount import Console

PATH = "/console/audit"


def _filters(action: str | None, actor: str | None) -> str:
    options = "".join(
        f'<option value="{esc(name)}"{" selected" if name == action else ""}>{esc(name)}</option>'
        for name in ACTIONS
    )
    return (
        f'<form class="card filters" method="get" action="{PATH}">'
        f'<label>Action<select name="action"><option value="">Any action</option>{options}'
        "</select></label>"
        + field("Actor", "actor", value=actor or "", extra='placeholder="user:ann@example.com"')
        + '<div class="actions"><button type="submit">Filter</button>'
        f' <a href="{PATH}">Clear</a></div></form>'
    )


def _row(entry: AuditView) -> list[str]:
    about = entry["target"]
    changes = orjson.dumps(entry["changes"]).decode() if entry["changes"] else ""
    return [
        short_time(entry["at"]),
        esc(entry["actor"]),
        f"<code>{esc(entry['action'])}</code>",
        f"{esc(about.get('type'))} <code>{esc(about.get('id') or about.get('email'))}</code>",
        f"<code>{esc(changes)}</code>",
        f"<code>{esc(entry['request_id'] or '')}</code>",
    ]


def routes(console: Console) -> list[Endpoint]:
    storage = console.storage

    async def audit(call: Call) -> Response:
        listed, action, actor = await audit_asked(storage, call)
        body = (
            "<h1>Audit log</h1>"
            '<p class="note">Every change to projects, keys, users and money, and every'
            " sign-in, from the console and the CLI: newest first.</p>"
            + _filters(action, actor)
            + table(
                ["Time (UTC)", "Actor", "Action", "Target", "Changes", "Request"],
                [_row(entry) for entry in listed["data"]],
                empty="No entry matches.",
            )
        )
        cursor = listed["next_cursor"]
        if cursor is not None:
            query = {"action": action, "actor": actor, "cursor": cursor}
            older = urlencode({name: value for name, value in query.items() if value})
            body += f'<p class="more"><a href="{PATH}?{esc(older)}">Older entries</a></p>'
        return page("Audit log", body, user=call.user)

    return [route("GET", PATH, PAGE, audit)]
