"""What the CLI's commands share (gateway/cli.py, gateway/cli_console.py): their error, the
argument types argparse converts with, and how a confirmed change is reported."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

from model_gateway.gateway.admin.admin_context import AdminContext, ConfirmedChange, InvalidChange
from model_gateway.gateway.admin.admin_views import with_instances
from model_gateway.gateway.metering.money import parse_amount
from model_gateway.gateway.ops.terminal import escape

# What a command prints: one JSON object with --json, else a line per field.
Record = dict[str, object]
# A command the admin service serves: its parser's `action_fn`, run with an AdminContext.
AdminCommand = Callable[[argparse.Namespace, AdminContext], Awaitable[Record]]
# How a command that sets its parser's `text` shows its record without --json.
TextView = Callable[[Record], str]


class CliError(Exception):
    """A command refused for its arguments: `invalid_request`, exit 1."""


def csv(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def parse_amount_arg(text: str) -> int:
    try:
        return parse_amount(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_time(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp())


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or a positive integer")
    return value


def refusal_message(exc: InvalidChange) -> str:
    """An admin refusal in the CLI's words: the field named by its flag."""
    return exc.reason if exc.param is None else f"--{exc.param.replace('_', '-')} {exc.reason}"


def confirmed_view(view: Mapping[str, object], change: ConfirmedChange[object]) -> Record:
    """The view of a changed key or project (revoked, archived, updated) with `instances`;
    an instance that did not confirm is also named on stderr."""
    confirmation = change.confirmation
    for name in confirmation.dead:
        print(f"gateway: instance {name} did not confirm; its lease ended", file=sys.stderr)
    for name in confirmation.unconfirmed:
        print(f"gateway: instance {name} has not confirmed yet", file=sys.stderr)
    return with_instances(view, confirmation)


def text_table(headers: list[str], rows: list[list[str]], *, numbers: bool = True) -> str:
    """Columns as wide as their widest cell: the first (a label) left-aligned, the others
    right-aligned when they are numbers, else left-aligned too; each cell escaped onto
    one line."""
    cells = [[escape(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(
            cell.rjust(width) if i and numbers else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    )
