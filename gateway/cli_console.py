"""The console's commands: users, payments, and what an operator needs beside them
(`projects list|update`, `keys list|update`). Registered by gateway/cli.py; every one
takes --json."""

from __future__ import annotations

import argparse
import sys

from model_gateway.gateway import cli
from model_gateway.gateway.console.views import iso, payment_view, user_view
from model_gateway.storage import RecordNotFound
from model_gateway.storage.base import UserRecord, new_id, now_s


def _listing(args, records: list[dict], label) -> dict:
    """--json: the API's list object; otherwise one readable line per record."""
    if args.json:
        return {"object": "list", "data": records}
    return {record["id"]: label(record) for record in records} or {"(none)": ""}


async def users_create(args, config, storage) -> dict:
    from model_gateway.gateway.console.passwords import hash_password

    if not args.password_stdin:
        raise cli.CliError("give the password on standard input with --password-stdin")
    password = sys.stdin.readline().rstrip("\r\n")
    try:
        password_hash = hash_password(password)
    except ValueError as exc:
        raise cli.CliError(str(exc)) from None
    user = UserRecord(
        id=new_id("usr"), email=args.email.strip(), password_hash=password_hash, created_at=now_s()
    )
    if "@" not in user.email:
        raise cli.CliError(f"not an email address: {args.email!r}")
    return user_view(await storage.create_user(user, args.role))


async def users_grant(args, config, storage) -> dict:
    await storage.grant_project(args.email, args.project)
    user = await storage.get_user(args.email)
    return user_view(user, sorted(await storage.granted_projects(user.id)))


async def users_list(args, config, storage) -> dict:
    users = [
        user_view(user, sorted(await storage.granted_projects(user.id)))
        for user in await storage.list_users()
    ]
    return _listing(
        args,
        users,
        lambda u: f"{u['email']} {u['role']}{' disabled' if u['disabled'] else ''}",
    )


async def users_disable(args, config, storage) -> dict:
    return user_view(await storage.disable_user(args.email))


async def payments_record(args, config, storage) -> dict:
    from model_gateway.gateway.console.records import record_payment

    if args.amount <= 0:
        raise cli.CliError("a payment must be more than zero")
    payment = await record_payment(storage, args.project, args.amount, args.reference, None)
    project = await cli.project_view(storage, await storage.get_project(args.project))
    return {**payment_view(payment), "balance": project["balance"]}


async def projects_list(args, config, storage) -> dict:
    projects = [await cli.project_view(storage, p) for p in await storage.list_projects()]
    return _listing(args, projects, lambda p: f"{p['name']} {p['state']} balance {p['balance']}")


async def keys_list(args, config, storage) -> dict:
    if await storage.get_project(args.project) is None:
        raise RecordNotFound(f"no project {args.project}")
    listed = []
    for listing in await storage.list_keys(args.project):
        view = await cli.key_view(storage, listing.key)
        listed.append({**view, "name": listing.name, "last_used_at": iso(listing.last_used_at)})
    return _listing(args, listed, lambda k: f"{k['prefix']} {k['state']} {','.join(k['scopes'])}")


def _or_none(parse):
    """An argument type that also takes `none`, which clears the value."""

    def convert(text: str):
        return None if text.strip().lower() == "none" else parse(text)

    return convert


def _changes(args, names: tuple[str, ...]) -> dict:
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


async def projects_update(args, config, storage) -> dict:
    changes = _changes(args, ("monthly_budget", "rpm", "allow_models", "exclude_models"))
    if changes.get("exclude_models", []) is None:
        changes["exclude_models"] = []
    project = await storage.update_project(args.id, changes)
    return await cli.confirmed_change(config, storage, await cli.project_view(storage, project))


async def keys_update(args, config, storage) -> dict:
    changes = _changes(args, ("name", "models", "monthly_limit", "expires_at", "rpm"))
    key = await storage.update_key(args.prefix, changes)
    return await cli.confirmed_change(config, storage, await cli.key_view(storage, key))


def _update_parsers(groups, common) -> None:
    hidden = {"default": argparse.SUPPRESS}  # absent: unchanged
    csv = _or_none(cli._csv)
    p = _subparsers(groups["projects"]).add_parser("update", parents=[common])
    p.add_argument("id")
    p.add_argument(
        "--budget", dest="monthly_budget", type=_or_none(cli._parse_amount_arg), **hidden
    )
    p.add_argument("--rpm", type=_or_none(cli._positive_int), **hidden)
    p.add_argument("--allow-models", dest="allow_models", type=csv, **hidden)
    p.add_argument("--exclude-models", dest="exclude_models", type=csv, **hidden)
    p.set_defaults(action_fn=projects_update)
    p = _subparsers(groups["keys"]).add_parser("update", parents=[common])
    p.add_argument("prefix")
    p.add_argument("--name", type=_or_none(str), **hidden)
    p.add_argument("--models", type=csv, **hidden)
    p.add_argument(
        "--monthly-limit", dest="monthly_limit", type=_or_none(cli._parse_amount_arg), **hidden
    )
    p.add_argument("--expires-at", dest="expires_at", type=_or_none(cli._parse_time), **hidden)
    p.add_argument("--rpm", type=_or_none(cli._positive_int), **hidden)
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
    p.add_argument("amount", type=cli._parse_amount_arg)
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
