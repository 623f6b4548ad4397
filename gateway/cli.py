"""The `gateway` command line. Every command that prints a record takes --json."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, NoReturn, TypeVar, cast

import orjson

from model_gateway.gateway import cli_audit, cli_console
from model_gateway.gateway.access import keys
from model_gateway.gateway.admin import (
    key_admin,
    money_admin,
    project_admin,
    sandbox_admin,
)
from model_gateway.gateway.admin.admin_context import (
    AdminContext,
    InvalidChange,
    NotPermitted,
    admin_context,
    cli_actor,
)
from model_gateway.gateway.admin.admin_views import key_view, project_view, sandbox_view
from model_gateway.gateway.cli_args import (
    AdminCommand,
    CliError,
    Record,
    TextView,
    confirmed_view,
    csv,
    non_negative_int,
    parse_amount_arg,
    parse_time,
    positive_int,
    refusal_message,
    text_table,
)
from model_gateway.gateway.cluster.admin_confirm import UNCONFIRMED_EXIT
from model_gateway.gateway.config import Config, ConfigError, load_config
from model_gateway.gateway.metering.money import format_amount
from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.gateway.ops import backup, doctor, model_prices
from model_gateway.gateway.ops.logs import configure_logging
from model_gateway.gateway.ops.secretfile import restrict_file_modes
from model_gateway.gateway.ops.terminal import escape, safe_output
from model_gateway.gateway.proofs import verify_cli
from model_gateway.gateway.sandbox.limits import SANDBOX_LIMITS
from model_gateway.pipeline.errors import InvalidRequest
from model_gateway.storage import (
    RecordNotFound,
    StateConflict,
    StorageError,
    open_storage,
)

if TYPE_CHECKING:
    from model_gateway.gateway.console.api_money import UsageReport

_T = TypeVar("_T")


class UsageError(Exception):
    """A command line argparse rejects; `main` reports it, as JSON with --json."""

    def __init__(self, usage: str, message: str) -> None:
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    # argparse prints usage and exits 2 on its own, deaf to --json: raise instead.
    # Subparsers are built with the parent's class, so this covers every command.
    def error(self, message: str) -> NoReturn:
        raise UsageError(self.format_usage(), message)


async def _with_admin(config: Config, action: Callable[[AdminContext], Awaitable[_T]]) -> _T:
    storage = await open_storage(config.storage_url)
    try:
        return await action(admin_context(storage, config, current_month, cli_actor()))
    finally:
        await storage.close()


async def projects_create(args: argparse.Namespace, admin: AdminContext) -> Record:
    project = await project_admin.create_project(
        admin,
        name=args.name,
        monthly_budget=args.budget,
        rpm=args.rpm,
        tpm=args.tpm,
        allow_models=csv(args.allow_models),
        exclude_models=csv(args.exclude_models),
        balance=args.balance,
    )
    return dict(await project_view(admin, project))


async def projects_show(args: argparse.Namespace, admin: AdminContext) -> Record:
    project = await admin.storage.get_project(args.id)
    if project is None:
        raise RecordNotFound(f"no project {args.id}")
    return dict(await project_view(admin, project))


async def projects_archive(args: argparse.Namespace, admin: AdminContext) -> Record:
    archived = await project_admin.archive_project(admin, args.id)
    return confirmed_view(await project_view(admin, archived.record), archived)


def exit_code(record: Mapping[str, object]) -> int:
    """0, or UNCONFIRMED_EXIT when an instance still holding its lease did not confirm."""
    instances = record.get("instances")
    return UNCONFIRMED_EXIT if isinstance(instances, dict) and instances["unconfirmed"] else 0


async def credit_add(args: argparse.Namespace, admin: AdminContext) -> Record:
    project = await money_admin.add_credit(admin, args.project, args.amount)
    return {"credited": format_amount(args.amount), **await project_view(admin, project)}


async def keys_create(args: argparse.Namespace, admin: AdminContext) -> Record:
    try:
        scopes = keys.parse_scopes(args.scopes)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    created = await key_admin.create_key(
        admin,
        args.project,
        scopes=scopes,
        models=csv(args.models),
        monthly_limit=args.monthly_limit,
        expires_at=args.expires_at,
        rpm=args.rpm,
        tpm=args.tpm,
    )
    return {"key": created.secret, **await key_view(admin, created.record)}


async def keys_revoke(args: argparse.Namespace, admin: AdminContext) -> Record:
    revoked = await key_admin.revoke_key(admin, args.prefix)
    return confirmed_view(await key_view(admin, revoked.record), revoked)


async def keys_show(args: argparse.Namespace, admin: AdminContext) -> Record:
    key = await admin.storage.get_key(args.prefix)
    if key is None:
        raise RecordNotFound(f"no key {args.prefix}")
    return dict(await key_view(admin, key))


async def sandboxes_create(args: argparse.Namespace, admin: AdminContext) -> Record:
    sandbox = await sandbox_admin.create_sandbox(
        admin,
        args.project,
        runtime=args.runtime,
        timeout_s=args.timeout_s,
        memory_mb=args.memory_mb,
    )
    return dict(sandbox_view(sandbox))


async def usage(args: argparse.Namespace, admin: AdminContext) -> Record:
    """The console's usage report (GET /console/api/projects/{id}/usage), its checks too."""
    # Here, not at the top: the console's modules are 80 ms of every CLI command's start.
    from model_gateway.gateway.console.api_money import usage_query, usage_report

    try:
        first, last, group_by = usage_query(args.first, args.last, args.group_by)
    except InvalidRequest as exc:
        flag = "--" + (exc.param or "").replace("_", "-")  # the console's query names
        raise CliError(f"{flag}: {exc.message}") from None
    if await admin.storage.get_project(args.project) is None:
        raise RecordNotFound(f"no project {args.project}")
    return dict(await usage_report(admin.storage, args.project, first, last, group_by))


# The usage table's columns after the group's: (the report's field, its heading).
_USAGE_COLUMNS = (
    ("requests", "requests"),
    ("input_tokens", "input"),
    ("cached_input_tokens", "cached"),
    ("cache_write_tokens", "cache writes"),
    ("output_tokens", "output"),
    ("reasoning_tokens", "reasoning"),
    ("sandbox_seconds", "sandbox s"),
    ("cost", "cost"),
    ("cache_savings", "cache savings"),
)


def usage_text(record: Record) -> str:
    """The report as a table, a row per group and the total (amounts in USD)."""
    report = cast("UsageReport", record)
    groups: list[Mapping[str, object]] = [*report["data"], {**report["total"], "group": "total"}]
    rows = [
        [str(group["group"] or "console playground"), *(str(group[f]) for f, _ in _USAGE_COLUMNS)]
        for group in groups
    ]
    title = f"{report['from']} to {report['to']} by {report['group_by']} (amounts in USD)"
    headings = [report["group_by"], *(heading for _, heading in _USAGE_COLUMNS)]
    return title + "\n" + text_table(headings, rows)


def sandbox_node(args: argparse.Namespace, config: Config) -> int:
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


def serve(args: argparse.Namespace, config: Config) -> int:
    # uvicorn and the workers' parent: imported only to serve
    from model_gateway.gateway.ops.server import serve as run_server
    from model_gateway.gateway.ops.workers import serve_workers, worker_count

    count = worker_count(config.server.workers if args.workers is None else args.workers)
    try:
        if count > 1:
            host = args.host or config.server.host
            return serve_workers(config, host, args.port or config.server.port, count)
        return run_server(config, args.host, args.port)
    except ConfigError as exc:  # e.g. a spawned node's port is taken
        # Logging is configured by now: the last line too follows log_format.
        logging.getLogger("gateway").error("%s", exc)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gateway", description="A metered, verifiable model gateway.")
    common = _Parser(add_help=False)
    common.add_argument("--config", help="config file (default: $GATEWAY_CONFIG or ./config.toml)")
    common.add_argument("--json", action="store_true", help="print one JSON object")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("serve", parents=[common], help="run the API")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument(
        "--workers",
        type=non_negative_int,
        help="serving processes sharing the port ([server] workers; 0: one per core)",
    )
    p.set_defaults(run=serve)

    projects = commands.add_parser("projects", help="manage projects").add_subparsers(
        dest="action", required=True
    )
    p = projects.add_parser("create", parents=[common])
    p.add_argument("name")
    p.add_argument("--budget", type=parse_amount_arg, help="monthly budget, e.g. 25.00")
    p.add_argument("--balance", type=parse_amount_arg, help="initial development credit")
    p.add_argument("--rpm", type=positive_int)
    p.add_argument("--tpm", type=positive_int, help="tokens per minute (input + output)")
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
    p.add_argument("--monthly-limit", type=parse_amount_arg)
    p.add_argument("--expires-at", type=parse_time, help="ISO 8601, e.g. 2027-01-01T00:00:00Z")
    p.add_argument("--rpm", type=positive_int)
    p.add_argument("--tpm", type=positive_int, help="tokens per minute (input + output)")
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
    p.add_argument("amount", type=parse_amount_arg)
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

    p = commands.add_parser("usage", parents=[common], help="a project's usage and cost")
    p.add_argument("--project", required=True)
    p.add_argument("--from", dest="first", metavar="YYYY-MM-DD", help="default: the 1st")
    p.add_argument("--to", dest="last", metavar="YYYY-MM-DD", help="included; default: month end")
    p.add_argument("--group-by", metavar="day|model|key", help="default: day")
    p.set_defaults(action_fn=usage, text=usage_text)

    model_prices.add_parser(commands, common)  # reads the config only
    verify_cli.add_parser(commands, common)  # needs no config: a customer runs it anywhere
    doctor.add_parser(commands, common)  # reads a config it may find broken: runs on its own
    backup.add_parsers(commands, common)
    cli_console.add_parsers(commands, common)  # users, payments, projects list, keys list
    cli_audit.add_parser(commands, common)
    return parser


def _print(record: Mapping[str, object], as_json: bool) -> None:
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
    as_json: bool = getattr(args, "json", False)
    if hasattr(args, "standalone"):  # doctor, backup, restore, verify: no config needed
        standalone: Callable[[argparse.Namespace], int] = args.standalone
        return standalone(args)
    try:
        config = load_config(args.config)
        if args.command != "sandbox-node":  # the node sets its sandboxes' modes itself
            restrict_file_modes()
        if hasattr(args, "run"):
            run: Callable[[argparse.Namespace, Config], int] = args.run
            return run(args, config)
        action_fn: AdminCommand = args.action_fn
        record = asyncio.run(_with_admin(config, lambda admin: action_fn(args, admin)))
    except ConfigError as exc:
        return _fail(str(exc), as_json, "invalid_request")
    except NotPermitted as exc:
        return _fail(str(exc), as_json, "forbidden")
    except InvalidChange as exc:
        return _fail(refusal_message(exc), as_json, "invalid_request")
    except RecordNotFound as exc:
        return _fail(str(exc), as_json, "not_found")
    except StateConflict as exc:
        return _fail(str(exc), as_json, "conflict")
    except CliError as exc:
        return _fail(str(exc), as_json, "invalid_request")
    except StorageError as exc:
        return _fail(f"storage failure: {exc}", as_json, "internal_error")
    text: TextView | None = getattr(args, "text", None)
    if text is not None and not as_json:
        print(text(record))
    else:
        _print(record, as_json)
    return exit_code(record)
