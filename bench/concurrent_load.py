"""A closed-loop load generator for many concurrent, long requests: N connections, each
sending one request after another (keep-alive), timing each request's first body bytes
(a stream's first event) and its end. Raw asyncio protocols on uvloop with httptools'
response parser, no client library: a thousand streams of 50 events a second cost it a
fraction of one core (`realistic.py` measures its CPU and says when it was the limit).
wrk times only the last byte, so it cannot give a stream's first event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import httptools

CONNECT_TIMEOUT_S = 10.0


@dataclass
class Done:
    """One finished request: when it ended, its first body bytes and its end, in seconds
    after it was sent, and its HTTP status (0: the connection failed)."""

    ended: float
    first_s: float
    total_s: float
    status: int


@dataclass
class Load:
    """What the generator records while it runs; `window` picks the requests that ended
    within a measured span."""

    done: list[Done] = field(default_factory=list)
    stopping: bool = False

    def window(self, start: float, end: float) -> list[Done]:
        return [d for d in self.done if start <= d.ended < end]


class _Exchange(asyncio.Protocol):
    """One keep-alive connection; `ask` sends a request and waits for its whole answer."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.answer: asyncio.Future[int] | None = None
        self.first = 0.0
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._finish(0)

    def on_body(self, body: bytes) -> None:
        if not self.first:
            self.first = time.perf_counter()

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if not self.parser.should_keep_alive():
            self.lost = True
        self._finish(status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._finish(0)

    def _finish(self, status: int) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(status)

    async def ask(self, request: bytes) -> tuple[int, float]:
        """(status, the time its first body bytes arrived)."""
        assert self.transport is not None
        self.first = 0.0
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.answer, self.first


def http_request(host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"host: {host}:{port}", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _client(host: str, port: int, request: bytes, load: Load) -> None:
    loop = asyncio.get_running_loop()
    exchange: _Exchange | None = None
    try:
        while not load.stopping:
            if exchange is None or exchange.lost:
                _close(exchange)
                try:
                    _, exchange = await asyncio.wait_for(
                        loop.create_connection(_Exchange, host, port), CONNECT_TIMEOUT_S
                    )
                except (OSError, TimeoutError):
                    load.done.append(Done(time.perf_counter(), 0.0, 0.0, 0))
                    await asyncio.sleep(0.1)
                    continue
            sent = time.perf_counter()
            status, first = await exchange.ask(request)
            ended = time.perf_counter()
            load.done.append(Done(ended, (first or ended) - sent, ended - sent, status))
    finally:
        _close(exchange)


def _close(exchange: _Exchange | None) -> None:
    if exchange is not None and exchange.transport is not None:
        exchange.transport.close()


@contextlib.asynccontextmanager
async def running(host: str, port: int, request: bytes, connections: int, ramp_s: float):
    """`connections` clients started over `ramp_s` (not all in one instant), stopped and
    their connections closed on the way out; yields their `Load`."""
    load = Load()
    tasks = []
    for n in range(connections):
        tasks.append(asyncio.create_task(_client(host, port, request, load)))
        if ramp_s and n % 10 == 9:
            await asyncio.sleep(ramp_s * 10 / connections)
    try:
        yield load
    finally:
        load.stopping = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
