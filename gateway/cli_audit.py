"""`gateway audit list`: the audit log, newest first, as the console's GET
/console/api/audit gives it (--json: its list object; else a table and the next cursor)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeVar, cast

import orjson

from model_gateway.gateway.admin.admin_context import AdminContext
from model_gateway.gateway.cli_args import CliError, Record, text_table

if TYPE_CHECKING:
    from model_gateway.gateway.admin.admin_views import AuditView
    from model_gateway.gateway.console.views import ListPage

_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)
MAX_LIMIT = 200  # the console's


def _limit(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_LIMIT}")
    return int(text)


def _cursor(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) >= 2**63:
        raise argparse.ArgumentTypeError("not a cursor this command gave")
    return int(text)


async def audit_list(args: argparse.Namespace, admin: AdminContext) -> Record:
    # Here, not at the top: the console's modules are 80 ms of every CLI command's start.
    from model_gateway.gateway.console import api_audit
    from model_gateway.pipeline.errors import InvalidRequest

    try:
        action, actor = api_audit.audit_filters(args.action_name, args.actor)
    except InvalidRequest as exc:
        raise CliError(f"--{exc.param}: {exc.message}") from None
    listed = await api_audit.audit_list(admin.storage, args.limit, args.cursor, action, actor)
    return dict(listed)


def audit_text(record: Record) -> str:
    """A row per entry, newest first; the cursor of the older ones after it."""
    listed = cast("ListPage[AuditView]", record)
    rows = [
        [
            entry["at"] or "",
            entry["actor"],
            entry["action"],
            " ".join(str(value) for value in entry["target"].values()),
            orjson.dumps(entry["changes"]).decode() if entry["changes"] else "",
        ]
        for entry in listed["data"]
    ]
    table = text_table(["at", "actor", "action", "target", "changes"], rows, numbers=False)
    cursor = listed["next_cursor"]
    return table + ("" if cursor is None else f"\nolder: gateway audit list --cursor {cursor}")


def add_parser(commands: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    audit = commands.add_parser("audit", help="the audit log").add_subparsers(
        dest="action", required=True
    )
    p = audit.add_parser("list", parents=[common], help="newest first")
    p.add_argument("--limit", type=_limit, default=50, help=f"1 to {MAX_LIMIT} (default 50)")
    p.add_argument("--cursor", type=_cursor, help="the next_cursor of the previous page")
    p.add_argument("--action", dest="action_name", metavar="ACTION", help="e.g. key.revoke")
    p.add_argument("--actor", help="e.g. cli:root or user:ann@example.com")
    p.set_defaults(action_fn=audit_list, text=audit_text)
