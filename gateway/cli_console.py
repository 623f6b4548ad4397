"""The console's commands: users, payments, and what an operator needs beside them
(`projects list|update`, `keys list|update`). Registered by gateway/cli.py; every one
takes --json."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar

from model_gateway.gateway.admin import key_admin, money_admin, project_admin, user_admin
from model_gateway.gateway.admin.admin_context import AdminContext
from model_gateway.gateway.admin.admin_views import (
    KeyView,
    ProjectView,
    UserView,
    iso,
    key_view,
    payment_view,
    project_view,
    user_view,
)
from model_gateway.gateway.admin.key_admin import KeyChanges
from model_gateway.gateway.admin.project_admin import ProjectChanges
from model_gateway.gateway.cli_args import (
    CliError,
    Record,
    confirmed_view,
    csv,
    parse_amount_arg,
    parse_time,
    positive_int,
)
from model_gateway.storage import RecordNotFound

_T = TypeVar("_T")
# The CLI's parser class: its subparsers and their parents are of that class.
_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)


class ListedKey(KeyView):
    """A key as `keys list` shows it."""

    name: str | None
    last_used_at: str | None


# What a listing lists.
_Listed = TypeVar("_Listed", UserView, ProjectView, ListedKey)


def _listing(
    args: argparse.Namespace, records: list[_Listed], label: Callable[[_Listed], str]
) -> Record:
    """--json: the API's list object; otherwise one readable line per record."""
    if args.json:
        return {"object": "list", "data": records}
    return {record["id"]: label(record) for record in records} or {"(none)": ""}


async def users_create(args: argparse.Namespace, admin: AdminContext) -> Record:
    if not args.password_stdin:
        raise CliError("give the password on standard input with --password-stdin")
    password = sys.stdin.readline().rstrip("\r\n")
    return dict(user_view(await user_admin.create_user(admin, args.email, password, args.role)))


async def users_grant(args: argparse.Namespace, admin: AdminContext) -> Record:
    user = await user_admin.grant_project(admin, args.email, args.project)
    return dict(user_view(user, sorted(await admin.storage.granted_projects(user.id))))


async def users_list(args: argparse.Namespace, admin: AdminContext) -> Record:
    storage = admin.storage
    users = [
        user_view(user, sorted(await storage.granted_projects(user.id)))
        for user in await storage.list_users()
    ]
    return _listing(
        args,
        users,
        lambda u: f"{u['email']} {u['role']}{' disabled' if u['disabled'] else ''}",
    )


async def users_disable(args: argparse.Namespace, admin: AdminContext) -> Record:
    return dict(user_view(await user_admin.disable_user(admin, args.email)))


async def payments_record(args: argparse.Namespace, admin: AdminContext) -> Record:
    payment = await money_admin.record_payment(
        admin, args.project, args.amount, args.reference, None
    )
    project = await admin.storage.get_project(args.project)
    if project is None:  # recorded, so it exists
        raise RecordNotFound(f"no project {args.project}")
    return {**payment_view(payment), "balance": (await project_view(admin, project))["balance"]}


async def projects_list(args: argparse.Namespace, admin: AdminContext) -> Record:
    projects = [await project_view(admin, p) for p in await admin.storage.list_projects()]
    return _listing(args, projects, lambda p: f"{p['name']} {p['state']} balance {p['balance']}")


async def keys_list(args: argparse.Namespace, admin: AdminContext) -> Record:
    if await admin.storage.get_project(args.project) is None:
        raise RecordNotFound(f"no project {args.project}")
    listed: list[ListedKey] = []
    for listing in await admin.storage.list_keys(args.project):
        view = await key_view(admin, listing.key)
        listed.append({**view, "name": listing.name, "last_used_at": iso(listing.last_used_at)})
    return _listing(args, listed, lambda k: f"{k['prefix']} {k['state']} {','.join(k['scopes'])}")


def _or_none(parse: Callable[[str], _T]) -> Callable[[str], _T | None]:
    """An argument type that also takes `none`, which clears the value."""

    def convert(text: str) -> _T | None:
        return None if text.strip().lower() == "none" else parse(text)

    return convert


# The flags of `projects update` and `keys update`, in the order the changes list them.
_PROJECT_FLAGS: tuple[
    Literal["monthly_budget", "rpm", "tpm", "allow_models", "exclude_models"], ...
] = (
    "monthly_budget",
    "rpm",
    "tpm",
    "allow_models",
    "exclude_models",
)
_KEY_FLAGS: tuple[Literal["name", "models", "monthly_limit", "expires_at", "rpm", "tpm"], ...] = (
    "name",
    "models",
    "monthly_limit",
    "expires_at",
    "rpm",
    "tpm",
)


def _project_changes(args: argparse.Namespace) -> ProjectChanges:
    """The given flags (absent ones are unchanged), as the admin service's changes."""
    changes: ProjectChanges = {}
    for name in _PROJECT_FLAGS:
        if hasattr(args, name):
            changes[name] = getattr(args, name)
    return changes


def _key_changes(args: argparse.Namespace) -> KeyChanges:
    """The given flags (absent ones are unchanged), as the admin service's changes."""
    changes: KeyChanges = {}
    for name in _KEY_FLAGS:
        if hasattr(args, name):
            changes[name] = getattr(args, name)
    return changes


async def projects_update(args: argparse.Namespace, admin: AdminContext) -> Record:
    changes = _project_changes(args)
    updated = await project_admin.update_project(admin, args.id, changes)
    return confirmed_view(await project_view(admin, updated.record), updated)


async def keys_update(args: argparse.Namespace, admin: AdminContext) -> Record:
    changes = _key_changes(args)
    updated = await key_admin.update_key(admin, args.prefix, changes)
    return confirmed_view(await key_view(admin, updated.record), updated)


def _update_parsers(groups: Mapping[str, _Parser], common: _Parser) -> None:
    absent = argparse.SUPPRESS  # the default of every flag: absent, unchanged
    csv_or_none = _or_none(csv)
    p = _subparsers(groups["projects"]).add_parser("update", parents=[common])
    p.add_argument("id")
    p.add_argument(
        "--budget", dest="monthly_budget", type=_or_none(parse_amount_arg), default=absent
    )
    p.add_argument("--rpm", type=_or_none(positive_int), default=absent)
    p.add_argument("--tpm", type=_or_none(positive_int), default=absent)
    p.add_argument("--allow-models", dest="allow_models", type=csv_or_none, default=absent)
    p.add_argument("--exclude-models", dest="exclude_models", type=csv_or_none, default=absent)
    p.set_defaults(action_fn=projects_update)
    p = _subparsers(groups["keys"]).add_parser("update", parents=[common])
    p.add_argument("prefix")
    p.add_argument("--name", type=_or_none(str), default=absent)
    p.add_argument("--models", type=csv_or_none, default=absent)
    p.add_argument(
        "--monthly-limit", dest="monthly_limit", type=_or_none(parse_amount_arg), default=absent
    )
    p.add_argument("--expires-at", dest="expires_at", type=_or_none(parse_time), default=absent)
    p.add_argument("--rpm", type=_or_none(positive_int), default=absent)
    p.add_argument("--tpm", type=_or_none(positive_int), default=absent)
    p.set_defaults(action_fn=keys_update)


def _subparsers(group: _Parser) -> argparse._SubParsersAction[_Parser]:
    """The subcommands of a command group (`projects`, `keys`)."""
    subparsers = next(a for a in group._actions if a.dest == "action")
    assert isinstance(subparsers, argparse._SubParsersAction)
    return subparsers


def add_parsers(commands: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
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
