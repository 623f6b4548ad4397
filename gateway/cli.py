"""The `gateway` command line. Every command that prints a record takes --json."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from datetime import UTC, datetime

import orjson

from model_gateway.gateway import backup, doctor, keys
from model_gateway.gateway.admin_confirm import UNCONFIRMED_EXIT, confirm_admin_change
from model_gateway.gateway.config import ConfigError, load_config
from model_gateway.gateway.logs import configure_logging
from model_gateway.gateway.metering import current_month
from model_gateway.gateway.money import format_amount, parse_amount
from model_gateway.gateway.proofs import verify_cli
from model_gateway.gateway.sandbox.limits import SANDBOX_LIMITS
from model_gateway.gateway.secretfile import load_or_create_secret
from model_gateway.gateway.terminal import escape, safe_output
from model_gateway.storage import (
    KeyRecord,
    ProjectRecord,
    RecordNotFound,
    SandboxRecord,
    StateConflict,
    StorageError,
    open_storage,
)
from model_gateway.storage.base import new_id, now_s


class CliError(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param  # the field at fault, for callers that answer over HTTP


class UsageError(Exception):
    """A command line argparse rejects; `main` reports it, as JSON with --json."""

    def __init__(self, usage: str, message: str) -> None:
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    # argparse prints usage and exits 2 on its own, deaf to --json: raise instead.
    # Subparsers are built with the parent's class, so this covers every command.
    def error(self, message: str):  # type: ignore[override]
        raise UsageError(self.format_usage(), message)


# Files the CLI and the server create (database, WAL, secrets) are the operator's alone.
PRIVATE_UMASK = 0o077


def restrict_file_modes() -> None:
    """Every file this process creates from now on is 0600, every folder 0700."""
    os.umask(PRIVATE_UMASK)


def _iso(ts: int | None) -> str | None:
    return (
        None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
    )


def _amount(micros: int | None) -> str | None:
    return None if micros is None else format_amount(micros)


def _csv(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def _parse_amount_arg(text: str) -> int:
    try:
        return parse_amount(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parse_time(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp())


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


async def project_view(storage, project: ProjectRecord) -> dict:
    account = await storage.project_account(project.id, current_month())
    return {
        "id": project.id,
        "name": project.name,
        "state": project.state,
        "balance": format_amount(account.balance),
        "monthly_budget": _amount(project.monthly_budget),
        "month_spend": format_amount(account.month_spend),
        "reserved": format_amount(account.reserved),
        "leased": format_amount(account.leased),
        "rpm": project.rpm,
        "allow_models": project.allow_models,
        "exclude_models": project.exclude_models,
        "created_at": _iso(project.created_at),
    }


async def key_view(storage, key: KeyRecord) -> dict:
    expired = key.expires_at is not None and key.expires_at <= now_s()
    return {
        "id": key.id,
        "prefix": key.prefix,
        "project": key.project_id,
        "scopes": sorted(key.scopes),
        "models": key.models,
        "monthly_limit": _amount(key.monthly_limit),
        "month_spend": format_amount(await storage.key_month_spend(key.id, current_month())),
        "expires_at": _iso(key.expires_at),
        "rpm": key.rpm,
        "state": "expired" if key.state == "usable" and expired else key.state,
        "created_at": _iso(key.created_at),
    }


async def _with_storage(config, action):
    storage = await open_storage(config.storage_url)
    try:
        return await action(storage)
    finally:
        await storage.close()


async def projects_create(args, config, storage) -> dict:
    if args.balance:
        _check_credit_permitted(config)  # before the project exists: never half-made
    project = ProjectRecord(
        id=new_id("prj"),
        name=args.name,
        monthly_budget=args.budget,
        rpm=args.rpm,
        allow_models=_csv(args.allow_models),
        exclude_models=_csv(args.exclude_models) or [],
        created_at=now_s(),
    )
    await storage.create_project(project)
    if args.balance:
        await _credit(config, storage, project.id, args.balance)
    return await project_view(storage, project)


async def projects_show(args, config, storage) -> dict:
    project = await storage.get_project(args.id)
    if project is None:
        raise RecordNotFound(f"no project {args.id}")
    return await project_view(storage, project)


async def projects_archive(args, config, storage) -> dict:
    archived = await storage.archive_project(args.id)
    return await confirmed_change(config, storage, await project_view(storage, archived))


async def confirmed_change(config, storage, view: dict) -> dict:
    """The view of a changed key or project (revoked, archived, updated), once every live
    instance dropped the change from its caches (or its lease ended): `instances` says
    which did."""
    confirmation = await confirm_admin_change(storage, config.cluster.lease_s)
    for name in confirmation.dead:
        print(f"gateway: instance {name} did not confirm; its lease ended", file=sys.stderr)
    for name in confirmation.unconfirmed:
        print(f"gateway: instance {name} has not confirmed yet", file=sys.stderr)
    return {**view, "instances": confirmation.view()}


def exit_code(record: dict) -> int:
    """0, or UNCONFIRMED_EXIT when an instance still holding its lease did not confirm."""
    instances = record.get("instances")
    return UNCONFIRMED_EXIT if isinstance(instances, dict) and instances["unconfirmed"] else 0


class NotPermitted(CliError):
    pass


def _check_credit_permitted(config) -> None:
    if config.server.environment == "production":
        raise NotPermitted("development credit is not permitted in production")


async def _credit(config, storage, project_id: str, amount: int) -> None:
    _check_credit_permitted(config)
    await storage.add_credit(project_id, amount, current_month())


async def _active_project(storage, project_id: str) -> ProjectRecord:
    """The project, if it exists and is not archived: credit and keys are for live ones."""
    project = await storage.get_project(project_id)
    if project is None:
        raise RecordNotFound(f"no project {project_id}")
    if project.state == "archived":
        raise StateConflict(f"project {project_id} is archived")
    return project


async def credit_add(args, config, storage) -> dict:
    _check_credit_permitted(config)
    await _active_project(storage, args.project)
    await _credit(config, storage, args.project, args.amount)
    project = await storage.get_project(args.project)
    return {"credited": format_amount(args.amount), **await project_view(storage, project)}


async def keys_create(args, config, storage) -> dict:
    try:
        scopes = keys.parse_scopes(args.scopes)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.expires_at is not None and args.expires_at <= now_s():
        raise CliError("--expires-at is in the past: the key would never work")
    await _active_project(storage, args.project)
    pepper = load_or_create_secret(config.path(config.secrets.key_pepper_file))
    secret = keys.generate_key()
    record = KeyRecord(
        id=new_id("key"),
        prefix=keys.public_prefix(secret),
        key_hash=keys.hash_key(pepper, secret),
        project_id=args.project,
        scopes=scopes,
        models=_csv(args.models),
        monthly_limit=args.monthly_limit,
        expires_at=args.expires_at,
        rpm=args.rpm,
        created_at=now_s(),
    )
    view = await key_view(storage, await storage.create_key(record))
    return {"key": secret, **view}


async def keys_revoke(args, config, storage) -> dict:
    prefix = args.prefix
    if keys.is_well_formed(prefix):
        # The whole key (e.g. pasted from a leak report): it must be the key stored under
        # its prefix, so that a made-up key never revokes someone else's.
        pepper = load_or_create_secret(config.path(config.secrets.key_pepper_file))
        stored = await storage.get_key(keys.public_prefix(prefix))
        if stored is None or not keys.matches(pepper, prefix, stored.key_hash):
            raise RecordNotFound("no such key")
        prefix = stored.prefix
    revoked = await storage.revoke_key(prefix)
    return await confirmed_change(config, storage, await key_view(storage, revoked))


async def keys_show(args, config, storage) -> dict:
    key = await storage.get_key(args.prefix)
    if key is None:
        raise RecordNotFound(f"no key {args.prefix}")
    return await key_view(storage, key)


def sandbox_view(sandbox: SandboxRecord) -> dict:
    return {
        "id": sandbox.id,
        "object": "sandbox",
        "project": sandbox.project_id,
        "runtime": sandbox.runtime,
        "timeout_s": sandbox.timeout_s,
        "memory_mb": sandbox.memory_mb,
        "created_at": _iso(sandbox.created_at),
    }


async def sandboxes_create(args, config, storage) -> dict:
    for name, value in (("timeout_s", args.timeout_s), ("memory_mb", args.memory_mb)):
        limit = SANDBOX_LIMITS[name]
        if not limit.low <= value <= limit.high:
            flag = "--" + name.replace("_", "-")
            raise CliError(f"{flag} must be between {limit.low} and {limit.high}", name)
    sandbox = SandboxRecord(
        id=new_id("sbx"),
        project_id=args.project,
        runtime=args.runtime,
        timeout_s=args.timeout_s,
        memory_mb=args.memory_mb,
        created_at=now_s(),
    )
    return sandbox_view(await storage.create_sandbox(sandbox))


def sandbox_node(args, config) -> int:
    from model_gateway.gateway.config import SandboxNodeConfig
    from model_gateway.gateway.sandbox.node.service import serve_node
    from model_gateway.gateway.sandbox.supervisor import node_address

    node = config.sandbox_node or SandboxNodeConfig()
    try:
        host, port = node_address(node.url)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    configure_logging(config.server.log_format)
    secret_file = config.path(node.secret_file)
    asyncio.run(
        serve_node(
            args.host or host, args.port or port, secret_file, max_concurrent=node.max_concurrent
        )
    )
    return 0


def serve(args, config) -> int:
    from model_gateway.gateway.server import serve as run_server  # uvicorn: only to serve

    try:
        run_server(config, args.host, args.port)
    except ConfigError as exc:  # e.g. a spawned node's port is taken
        # Logging is configured by now: the last line too follows log_format.
        logging.getLogger("gateway").error("%s", exc)
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gateway", description="A metered, verifiable model gateway.")
    common = _Parser(add_help=False)
    common.add_argument("--config", help="config file (default: $GATEWAY_CONFIG or ./config.toml)")
    common.add_argument("--json", action="store_true", help="print one JSON object")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("serve", parents=[common], help="run the API")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.set_defaults(run=serve)

    projects = commands.add_parser("projects", help="manage projects").add_subparsers(
        dest="action", required=True
    )
    p = projects.add_parser("create", parents=[common])
    p.add_argument("name")
    p.add_argument("--budget", type=_parse_amount_arg, help="monthly budget, e.g. 25.00")
    p.add_argument("--balance", type=_parse_amount_arg, help="initial development credit")
    p.add_argument("--rpm", type=_positive_int)
    p.add_argument("--allow-models", help="comma-separated allowlist")
    p.add_argument("--exclude-models", help="comma-separated exclusions")
    p.set_defaults(action_fn=projects_create)
    p = projects.add_parser("show", parents=[common])
    p.add_argument("id")
    p.set_defaults(action_fn=projects_show)
    p = projects.add_parser("archive", parents=[common])
    p.add_argument("id")
    p.set_defaults(action_fn=projects_archive)

    keys_cmd = commands.add_parser("keys", help="manage API keys").add_subparsers(
        dest="action", required=True
    )
    p = keys_cmd.add_parser("create", parents=[common])
    p.add_argument("--project", required=True)
    p.add_argument(
        "--scopes", required=True, help="comma-separated: inference,sandboxes,receipts,agents"
    )
    p.add_argument("--models", help="comma-separated models the key may use")
    p.add_argument("--monthly-limit", type=_parse_amount_arg)
    p.add_argument("--expires-at", type=_parse_time, help="ISO 8601, e.g. 2027-01-01T00:00:00Z")
    p.add_argument("--rpm", type=_positive_int)
    p.set_defaults(action_fn=keys_create)
    p = keys_cmd.add_parser("revoke", parents=[common])
    p.add_argument("prefix", metavar="PREFIX_OR_KEY", help="the public prefix, or the whole key")
    p.set_defaults(action_fn=keys_revoke)
    p = keys_cmd.add_parser("show", parents=[common])
    p.add_argument("prefix")
    p.set_defaults(action_fn=keys_show)

    credit = commands.add_parser("credit", help="development credit")
    credit_cmd = credit.add_subparsers(dest="action", required=True)
    p = credit_cmd.add_parser("add", parents=[common])
    p.add_argument("--project", required=True)
    p.add_argument("amount", type=_parse_amount_arg)
    p.set_defaults(action_fn=credit_add)

    sandboxes = commands.add_parser("sandboxes", help="sandbox configurations")
    sandboxes_cmd = sandboxes.add_subparsers(dest="action", required=True)
    p = sandboxes_cmd.add_parser("create", parents=[common])
    p.add_argument("--project", required=True)
    p.add_argument("--runtime", required=True, choices=["python", "node", "bash"])
    p.add_argument("--timeout-s", type=int, default=SANDBOX_LIMITS["timeout_s"].default)
    p.add_argument("--memory-mb", type=int, default=SANDBOX_LIMITS["memory_mb"].default)
    p.set_defaults(action_fn=sandboxes_create)

    p = commands.add_parser("sandbox-node", parents=[common], help="run the sandbox node")
    p.add_argument("--host", help="default: the host of [sandbox_node] url")
    p.add_argument("--port", type=int, help="default: the port of [sandbox_node] url")
    p.set_defaults(run=sandbox_node)

    verify_cli.add_parser(commands, common)  # needs no config: a customer runs it anywhere
    doctor.add_parser(commands, common)  # reads a config it may find broken: runs on its own
    backup.add_parsers(commands, common)
    from model_gateway.gateway import cli_console  # it imports this module: not at the top

    cli_console.add_parsers(commands, common)  # users, payments, projects list, keys list
    return parser


def _print(record: dict, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(orjson.dumps(record).decode() + "\n")
        return
    for name, value in record.items():
        if isinstance(value, dict):
            _print({f"{name}.{inner}": v for inner, v in value.items()}, as_json)
            continue
        shown = ",".join(value) if isinstance(value, list) else ("-" if value is None else value)
        print(f"{escape(name)}: {escape(str(shown))}")


def _fail(message: str, as_json: bool, kind: str) -> int:
    if as_json:
        sys.stdout.write(
            orjson.dumps({"error": {"type": kind, "message": message}}).decode() + "\n"
        )
    print(f"gateway: {escape(message)}", file=sys.stderr)  # it may quote a name
    return 1


def _usage_failed(exc: UsageError, argv: list[str]) -> int:
    # The parse failed, so --json is looked for among the words themselves.
    if "--json" in argv:
        _fail(exc.args[0], True, "invalid_request")
        return 2
    sys.stderr.write(exc.usage)
    print(f"gateway: error: {exc.args[0]}", file=sys.stderr)
    return 2  # argparse's own code for a usage error


def main(argv: list[str] | None = None) -> int:
    with safe_output():  # every command's output, whoever prints it
        return _run(sys.argv[1:] if argv is None else list(argv))


def _run(words: list[str]) -> int:
    try:
        args = _parser().parse_args(words)
    except UsageError as exc:
        return _usage_failed(exc, words)
    as_json = getattr(args, "json", False)
    if hasattr(args, "standalone"):
        return args.standalone(args)
    try:
        config = load_config(args.config)
        if args.command != "sandbox-node":  # the node sets its sandboxes' modes itself
            restrict_file_modes()
        if hasattr(args, "run"):
            return args.run(args, config)
        record = asyncio.run(
            _with_storage(config, lambda storage: args.action_fn(args, config, storage))
        )
    except ConfigError as exc:
        return _fail(str(exc), as_json, "invalid_request")
    except NotPermitted as exc:
        return _fail(str(exc), as_json, "forbidden")
    except RecordNotFound as exc:
        return _fail(str(exc), as_json, "not_found")
    except StateConflict as exc:
        return _fail(str(exc), as_json, "conflict")
    except CliError as exc:
        return _fail(str(exc), as_json, "invalid_request")
    except StorageError as exc:
        return _fail(f"storage failure: {exc}", as_json, "internal_error")
    _print(record, as_json)
    return exit_code(record)
