"""GET /console/api/audit: the audit log, newest first, for owners (members: 403)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from starlette.responses import Response

from model_gateway.gateway.admin.admin_views import AuditView, audit_view
from model_gateway.gateway.console.call import SESSION, Call, route
from model_gateway.gateway.console.guard import require_owner
from model_gateway.gateway.console.payload import query_cursor, query_limit
from model_gateway.gateway.console.views import ListPage, page
from model_gateway.gateway.json_response import json_response
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import InvalidRequest

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console
    from model_gateway.storage.ports import AuditPort

# Every action an entry may name (decisions.md, Operators (wave 3)), in the filter's order.
ACTIONS = (
    "project.create",
    "project.update",
    "project.archive",
    "key.create",
    "key.update",
    "key.revoke",
    "user.create",
    "user.grant",
    "user.disable",
    "payment.record",
    "credit.add",
    "purchase.credit",
    "session.sign_in",
    "session.sign_in_failed",
)
_ACTOR = re.compile(r"[^\x00-\x1f\x7f]{1,330}")  # "user:" and an email of at most 320


def audit_filters(action: str | None, actor: str | None) -> tuple[str | None, str | None]:
    """The filters of a listing (an empty value: none); a bad one is 400 naming it."""
    action, actor = action or None, actor or None
    if action is not None and action not in ACTIONS:
        raise InvalidRequest("'action' is not an action of the audit log.", param="action")
    if actor is not None and _ACTOR.fullmatch(actor) is None:
        raise InvalidRequest("'actor' must be at most 330 printable characters.", param="actor")
    return action, actor


async def audit_list(
    storage: AuditPort,
    limit: int,
    before: int | None,
    action: str | None = None,
    actor: str | None = None,
) -> ListPage[AuditView]:
    """A page of entries, newest first, and the cursor of the next (older) one."""
    rows = await storage.list_audit(limit + 1, before, action=action, actor=actor)
    more = len(rows) > limit
    rows = rows[:limit]
    return page([audit_view(entry) for _, entry in rows], rows[-1][0] if more else None)


async def audit_asked(
    storage: AuditPort, call: Call
) -> tuple[ListPage[AuditView], str | None, str | None]:
    """The page of entries an owner's call asks for (the API's and the page's), with its
    action and actor filters."""
    require_owner(call.session_user)
    limit = query_limit(call.query("limit"))
    before = query_cursor(call.query("cursor"))
    action, actor = audit_filters(call.query("action"), call.query("actor"))
    return await audit_list(storage, limit, before, action, actor), action, actor


def routes(console: Console) -> list[Endpoint]:
    storage = console.storage

    async def audit(call: Call) -> Response:
        listed, _, _ = await audit_asked(storage, call)
        return json_response(listed)

    return [route("GET", "/console/api/audit", SESSION, audit)]
