"""How the gateway logs: readable lines or one JSON object per line (`[server] log_format`),
and the access log, one line per request.

Only what an operator needs to follow a request: never keys, prompts, outputs or
upstream bodies (the context holds the body; this module never reads it).

Every line of `gateway serve` and of its children (the spawned sandbox node, the log
process) goes through `configure_logging`, uvicorn's own loggers included (they run with
`log_config=None` and propagate here), so that a JSON deployment gets nothing but JSON
lines. JSON times are RFC 3339 UTC with milliseconds and `Z`. `GET /healthz` is never
logged: probes every few seconds would bury the requests.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from functools import lru_cache
from typing import Literal, TextIO
from urllib.parse import quote

import orjson

from model_gateway.gateway.metering.money import format_amount
from model_gateway.gateway.ops.terminal import SafeStream
from model_gateway.pipeline.context import RequestContext

access = logging.getLogger("gateway.access")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
HEALTH_PATH = "/healthz"


@lru_cache(maxsize=4)
def _second(whole: int, utc: bool) -> str:
    # Formatted once a second, not once a line (~3 us of the access line's budget).
    if utc:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(whole))


def json_time(seconds: float) -> str:
    """RFC 3339 in UTC with milliseconds: 2026-11-28T07:01:02.123Z."""
    whole = int(seconds)
    return f"{_second(whole, True)}.{int((seconds - whole) * 1000):03d}Z"


def text_time(seconds: float) -> str:
    """Local time as `logging` writes %(asctime)s: 2026-11-28 08:01:02,123."""
    whole = int(seconds)
    return f"{_second(whole, False)},{int((seconds - whole) * 1000):03d}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a record's `fields` (extra) become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": json_time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure_logging(log_format: Literal["text", "json"], level: int = logging.INFO) -> None:
    # Escaped: a message may quote what a client sent (the children have no other guard).
    handler = logging.StreamHandler(SafeStream(sys.stderr))
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)  # a Python warning is a log line too, not raw stderr


def access_record(
    ctx: RequestContext, method: str, path: str, status: int, seconds: float
) -> dict[str, object]:
    settled = ctx.hold.settlement if ctx.hold is not None else None
    return {
        "request_id": ctx.request_id,
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": round(seconds * 1000, 3),
        "model": ctx.model_id,
        "provider": ctx.provider,
        "project_id": ctx.project.id if ctx.project is not None else None,
        "receipt_id": settled.receipt_id if settled is not None else None,
        "cost": format_amount(settled.cost) if settled is not None else None,
        "user": ctx.user,  # the console's signed-in user (email); None elsewhere
    }


_TEXT_FIELDS = (
    ("model", "model"),
    ("provider", "provider"),
    ("project", "project_id"),
    ("receipt", "receipt_id"),
    ("cost", "cost"),
    ("user", "user"),
)


def text_line(record: dict[str, object]) -> str:
    path = str(record["path"])
    if " " in path or not path.isprintable():
        # uvicorn decoded it: percent-encoded again, it stays one word of its own line
        # (a `%20cost=` in it could otherwise pass for the line's own fields).
        path = quote(path, safe="/:@!$&'()*+,;=-._~")
    words = [
        f"{record['request_id']} {record['method']} {path} {record['status']}",
        f"{record['duration_ms']}ms",
        *(f"{name}={record[field]}" for name, field in _TEXT_FIELDS if record[field] is not None),
    ]
    line = " ".join(words)
    # One request, one line, whatever another field holds.
    return line if line.isprintable() else line.encode("unicode_escape").decode("ascii")


class AccessLog:
    """The `RequestObserver` that writes the access log: one line per request on stderr.

    Written straight to a buffered stream rather than through `logging`, which cost ~18 µs
    a line (a record, a formatter and a flush each time) against ~4 µs here. Lines wait at
    most FLUSH_S in the buffer, and are flushed at shutdown (`close`).
    """

    FLUSH_S = 0.25

    def __init__(self, log_format: Literal["text", "json"], stream: TextIO | None = None) -> None:
        self.json = log_format == "json"
        self.out = stream or open(
            sys.stderr.fileno(), "w", buffering=1 << 16, encoding="utf-8", closefd=False
        )
        self._flush_pending = False

    def request_done(
        self, ctx: RequestContext, method: str, path: str, status: int, seconds: float
    ) -> None:
        if path == HEALTH_PATH and method in ("GET", "HEAD"):
            return  # probes, every few seconds from each balancer and monitor
        record = access_record(ctx, method, path, status, seconds)
        if self.json:
            line = orjson.dumps(
                {"time": json_time(time.time()), "level": "info", "logger": access.name, **record}
            )
            self.out.write(line.decode() + "\n")
        else:
            self.out.write(f"{text_time(time.time())} INFO {access.name} {text_line(record)}\n")
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_later(self.FLUSH_S, self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        self.out.flush()

    def close(self) -> None:
        self.out.flush()
