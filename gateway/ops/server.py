"""`gateway serve`: uvicorn with bounded request heads and timeouts for slow clients.

uvicorn's httptools protocol has no limit on a request head: httptools joins the pieces
of a header value with `bytes +=`, so a 128 MiB header costs quadratic copying on the one
event loop (every other client waits for seconds) and is then answered. Nor does it time
out a client that never finishes its head or stalls its body (slowloris).
`BoundedHttpToolsProtocol` counts head bytes before the parser sees them and refuses a
head over `max_head_bytes` or `MAX_HEADER_FIELDS` fields with 431, without reading the
rest; it disconnects a head not complete within `head_timeout_s` and a body that sends
nothing for `body_timeout_s`. decisions.md, "Hardening decisions", fixes the numbers.

The class extends uvicorn's `HttpToolsProtocol` and relies on its parser callbacks and
its `parser`, `transport`, `cycle` and `flow` attributes: tests/e2e/test_hostile_clients.py
runs it against a real process, so an uvicorn upgrade that changes them fails there.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from model_gateway.gateway.config import Config
from model_gateway.gateway.ops.logs import configure_logging
from model_gateway.gateway.ops.secretfile import restrict_file_modes
from model_gateway.gateway.ops.summary import console_url, listen_url

MAX_HEADER_FIELDS = 100  # decisions.md; a fixed number, not a config key
YOUNG_COLLECTION_AFTER = 10_000  # net allocations (Python's default: 700)


@dataclass(frozen=True)
class HeadLimits:
    max_head_bytes: int = 65536
    max_header_fields: int = MAX_HEADER_FIELDS
    head_timeout_s: float = 30.0
    body_timeout_s: float = 60.0


class HeadRefused(Exception):
    """Raised from a parser callback: httptools stops parsing at once and re-raises."""


def _refusal(reason: str) -> bytes:
    body = reason.encode()
    return b"".join(
        [
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """One connection. A head is "open" from the connection's start, and again after
    each complete request, until the parser reports the end of the head."""

    limits: HeadLimits = HeadLimits()  # set per server by `protocol_class`

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_open = True
        self._head_bytes = 0
        self._body_open = False
        self._last_read = self.loop.time()
        self._refused: str | None = None
        # One timer at a time, armed only when a read leaves a head or a body unfinished
        # (a head that arrives whole, the usual case, costs no timer): the head deadline
        # counts from the head's first byte, the body check from the last byte read.
        self._head_began: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        # A new connection's head deadline counts from the connection: one that never
        # sends a byte is dropped too (between requests, uvicorn's keep-alive timeout).
        self._arm(self.limits.head_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # Reading: count the head's bytes before httptools buffers them.

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        self._last_read = self.loop.time()
        if len(data) <= self._room():
            self._feed(data)  # the common case: one piece, no slicing, no copy
        else:
            self._feed_in_pieces(memoryview(data))
        if self._timer is None and (self._head_began is not None or self._body_open):
            self._watch_unfinished()

    def _watch_unfinished(self) -> None:
        if self.transport.is_closing():
            return
        if self._head_began is not None:
            left = self._head_began + self.limits.head_timeout_s - self._last_read
            self._arm(left, self._head_timed_out)
        elif self._body_open:
            self._arm(self.limits.body_timeout_s, self._body_stalled)

    def _room(self) -> int:
        """How much may be fed at once without passing the head limit unnoticed.

        A piece that ends one request may carry the start of a pipelined next one, which
        is not counted: a head can be read up to twice the limit before it is refused.
        """
        if self._head_open:
            return self.limits.max_head_bytes - self._head_bytes
        return self.limits.max_head_bytes

    def _feed_in_pieces(self, view: memoryview) -> None:
        while view and not self.transport.is_closing():
            room = self._room()
            if room <= 0:
                self._refuse(f"request head over {self.limits.max_head_bytes} bytes")
                return
            self._feed(view[:room])
            view = view[room:]

    def _feed(self, piece: bytes | memoryview) -> None:
        if self._head_open:
            self._head_bytes += len(piece)
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()  # served without websockets (ws="none")
        except httptools.HttpParserError:
            if self._refused is not None:
                self._refuse(self._refused)
                return
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        if self._head_open and self._head_bytes >= self.limits.max_head_bytes:
            # The limit is reached and the head goes on: refuse before reading further.
            self._refuse(f"request head over {self.limits.max_head_bytes} bytes")

    def _refuse(self, reason: str) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head behind a response in progress: a 431 would corrupt it.
            self.transport.abort()
            return
        self.transport.write(_refusal(reason))
        self.transport.close()

    # Parser callbacks: where a head and a body begin and end.

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_began = self._last_read  # the read that holds the head's first byte

    def on_headers_complete(self) -> None:
        # Counted here, not per header: max_head_bytes already bounds the list, and the
        # app must not start. The exception stops httptools before any later callback.
        if len(self.headers) > self.limits.max_header_fields:
            self._refused = f"more than {self.limits.max_header_fields} header fields"
            raise HeadRefused(self._refused)
        self._head_open = False
        self._head_began = None
        self._body_open = True
        if self._timer is not None:
            self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._body_open = False
        self._head_open = True
        self._head_bytes = 0
        if self._timer is not None:
            self._disarm()
        super().on_message_complete()

    # Timers.

    def _arm(self, delay: float, callback: Callable[[], object]) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        if self._head_open and not self.transport.is_closing():
            # abort, not close: close would wait to flush to a client that may not read.
            self.transport.abort()

    def _body_stalled(self) -> None:
        self._timer = None
        if not self._body_open or self.transport.is_closing():
            return
        idle = self.loop.time() - self._last_read
        if self.flow.read_paused:
            idle = 0.0  # we stopped reading (the app is behind): the client is not stalling
        if idle >= self.limits.body_timeout_s:
            self.transport.abort()
        else:
            self._arm(self.limits.body_timeout_s - idle, self._body_stalled)


def protocol_class(limits: HeadLimits) -> type[BoundedHttpToolsProtocol]:
    """uvicorn builds its protocol from the class alone: the limits ride on a subclass."""
    return type("GatewayHttpProtocol", (BoundedHttpToolsProtocol,), {"limits": limits})


def limits_from(config: Config) -> HeadLimits:
    server = config.server
    return HeadLimits(
        max_head_bytes=server.max_head_bytes,
        head_timeout_s=server.head_timeout_s,
        body_timeout_s=server.body_timeout_s,
    )


def uvicorn_options(
    config: Config, host: str | None = None, port: int | None = None
) -> dict[str, Any]:
    """uvicorn.run's options for this config (bench/hostile_heads.py varies `http`)."""
    return {
        "host": host or config.server.host,
        "port": port or config.server.port,
        "loop": "uvloop",
        "http": protocol_class(limits_from(config)),
        "ws": "none",  # the gateway has no websocket endpoint: no second parser to bound
        "lifespan": "on",
        "access_log": False,  # gateway.logs.AccessLog writes it
        "log_level": "warning",
        "log_config": None,  # uvicorn's loggers propagate to ours: one format (log_format)
    }


def prepare_to_serve(config: Config) -> None:
    """What a serving process does first: one worker, or the parent of several."""
    restrict_file_modes()  # before anything opens the database or writes a secret (0600)
    configure_logging(config.server.log_format)


def serve(
    config: Config, host: str | None = None, port: int | None = None, **overrides: Any
) -> int:
    """Serve in this process until stopped; the exit code (several workers:
    gateway/ops/workers.py)."""
    import uvicorn

    from model_gateway.gateway.app import create_app

    prepare_to_serve(config)
    options = {**uvicorn_options(config, host, port), **overrides}
    log = logging.getLogger("gateway")
    log.info("listening on %s", listen_url(options["host"], options["port"]))
    log.info("console: %s", console_url(config, options["host"], options["port"]))
    app = create_app(config, on_started=tune_garbage_collector, log_process=True)
    uvicorn.run(app, **options)
    return 0


def tune_garbage_collector() -> None:
    """Collect cycles only when young objects pile up, and never walk start-up's again.

    Called once started, before the first request. Measured under load (chat, 32
    connections, metering on; gc.callbacks timing each collection):
    - Python collects the youngest generation after 700 net allocations, and the live
      objects of 32 requests in flight hover around that: ~140 collections a second
      (8 µs a request). At 10,000 they run a few times a minute: what requests allocate is
      freed by reference counting long before.
    - the ~47,000 objects start-up built (modules, configuration, catalog, pools) live as
      long as the process; every full collection walked them again (~19 ms each).
      `gc.freeze()` moves them out of the collector's sight.
    Together: 22 -> 0.6 µs of collection a request.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_AFTER)
