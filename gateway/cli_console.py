"""The console's commands: users, payments, and what an operator needs beside them
(`projects list|update`, `keys list|update`). Registered by gateway/cli.py; every one
takes --json."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from model_gateway.gateway.admin import key_admin, money_admin, project_admin, user_admin
from model_gateway.gateway.admin.admin_context import AdminContext
from model_gateway.gateway.admin.admin_views import (
    iso,
    key_view,
    payment_view,
    project_view,
    user_view,
)
from model_gateway.gateway.cli_args import (
    CliError,
    confirmed_view,
    csv,
    parse_amount_arg,
    parse_time,
    positive_int,
)
from model_gateway.storage import RecordNotFound


def _listing(args, records: list[dict], label) -> dict:
    """--json: the API's list object; otherwise one readable line per record."""
    if args.json:
        return {"object": "list", "data": records}
    return {record["id"]: label(record) for record in records} or {"(none)": ""}


async def users_create(args, admin: AdminContext) -> dict:
    if not args.password_stdin:
        raise CliError("give the password on standard input with --password-stdin")
    password = sys.stdin.readline().rstrip("\r\n")
    return dict(user_view(await user_admin.create_user(admin, args.email, password, args.role)))


async def users_grant(args, admin: AdminContext) -> dict:
    user = await user_admin.grant_project(admin, args.email, args.project)
    return dict(user_view(user, sorted(await admin.storage.granted_projects(user.id))))


async def users_list(args, admin: AdminContext) -> dict:
    storage = admin.storage
    users = [
        dict(user_view(user, sorted(await storage.granted_projects(user.id))))
        for user in await storage.list_users()
    ]
    return _listing(
        args,
        users,
        lambda u: f"{u['email']} {u['role']}{' disabled' if u['disabled'] else ''}",
    )


async def users_disable(args, admin: AdminContext) -> dict:
    return dict(user_view(await user_admin.disable_user(admin, args.email)))


async def payments_record(args, admin: AdminContext) -> dict:
    payment = await money_admin.record_payment(
        admin, args.project, args.amount, args.reference, None
    )
    project = await admin.storage.get_project(args.project)
    if project is None:  # recorded, so it exists
        raise RecordNotFound(f"no project {args.project}")
    return {**payment_view(payment), "balance": (await project_view(admin, project))["balance"]}


async def projects_list(args, admin: AdminContext) -> dict:
    projects = [dict(await project_view(admin, p)) for p in await admin.storage.list_projects()]
    return _listing(args, projects, lambda p: f"{p['name']} {p['state']} balance {p['balance']}")


async def keys_list(args, admin: AdminContext) -> dict:
    if await admin.storage.get_project(args.project) is None:
        raise RecordNotFound(f"no project {args.project}")
    listed = []
    for listing in await admin.storage.list_keys(args.project):
        view = await key_view(admin, listing.key)
        listed.append({**view, "name": listing.name, "last_used_at": iso(listing.last_used_at)})
    return _listing(args, listed, lambda k: f"{k['prefix']} {k['state']} {','.join(k['scopes'])}")


def _or_none(parse):
    """An argument type that also takes `none`, which clears the value."""

    def convert(text: str):
        return None if text.strip().lower() == "none" else parse(text)

    return convert


def _changes(args, names: tuple[str, ...]) -> Any:
    """The given flags (absent ones are unchanged), as the admin service's changes."""
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


async def projects_update(args, admin: AdminContext) -> dict:
    changes = _changes(args, ("monthly_budget", "rpm", "allow_models", "exclude_models"))
    updated = await project_admin.update_project(admin, args.id, changes)
    return confirmed_view(await project_view(admin, updated.record), updated)


async def keys_update(args, admin: AdminContext) -> dict:
    changes = _changes(args, ("name", "models", "monthly_limit", "expires_at", "rpm"))
    updated = await key_admin.update_key(admin, args.prefix, changes)
    return confirmed_view(await key_view(admin, updated.record), updated)


def _update_parsers(groups, common) -> None:
    hidden = {"default": argparse.SUPPRESS}  # absent: unchanged
    csv_or_none = _or_none(csv)
    p = _subparsers(groups["projects"]).add_parser("update", parents=[common])
    p.add_argument("id")
    p.add_argument("--budget", dest="monthly_budget", type=_or_none(parse_amount_arg), **hidden)
    p.add_argument("--rpm", type=_or_none(positive_int), **hidden)
    p.add_argument("--allow-models", dest="allow_models", type=csv_or_none, **hidden)
    p.add_argument("--exclude-models", dest="exclude_models", type=csv_or_none, **hidden)
    p.set_defaults(action_fn=projects_update)
    p = _subparsers(groups["keys"]).add_parser("update", parents=[common])
    p.add_argument("prefix")
    p.add_argument("--name", type=_or_none(str), **hidden)
    p.add_argument("--models", type=csv_or_none, **hidden)
    p.add_argument(
        "--monthly-limit", dest="monthly_limit", type=_or_none(parse_amount_arg), **hidden
    )
    p.add_argument("--expires-at", dest="expires_at", type=_or_none(parse_time), **hidden)
    p.add_argument("--rpm", type=_or_none(positive_int), **hidden)
    p.set_defaults(action_fn=keys_update)


def _subparsers(group):
    return next(a for a in group._actions if a.dest == "action")


def add_parsers(commands, common) -> None:
    """Add `users`, `payments`, `projects list` and `keys list` to the CLI's parsers."""
    users = commands.add_parser("users", help="console users").add_subparsers(
        dest="action", required=True
    )
    p = users.add_parser("create", parents=[common])
    p.add_argument("email")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    p.add_argument("--role", choices=["owner", "member"], help="default: owner for the first")
    p.set_defaults(action_fn=users_create)
    p = users.add_parser("grant", parents=[common])
    p.add_argument("email")
    p.add_argument("--project", required=True)
    p.set_defaults(action_fn=users_grant)
    p = users.add_parser("list", parents=[common])
    p.set_defaults(action_fn=users_list)
    p = users.add_parser("disable", parents=[common])
    p.add_argument("email")
    p.set_defaults(action_fn=users_disable)

    payments = commands.add_parser("payments", help="record money received").add_subparsers(
        dest="action", required=True
    )
    p = payments.add_parser("record", parents=[common])
    p.add_argument("--project", required=True)
    p.add_argument("amount", type=parse_amount_arg)
    p.add_argument("--reference", required=True, help="unique per project, e.g. an invoice no.")
    p.set_defaults(action_fn=payments_record)

    # `list` and `update` join the existing `projects` and `keys` groups.
    groups = dict(commands.choices)
    p = _subparsers(groups["projects"]).add_parser("list", parents=[common])
    p.set_defaults(action_fn=projects_list)
    p = _subparsers(groups["keys"]).add_parser("list", parents=[common])
    p.add_argument("--project", required=True)
    p.set_defaults(action_fn=keys_list)
    _update_parsers(groups, common)
