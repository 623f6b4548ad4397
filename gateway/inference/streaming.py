"""Streams to the client: open the upstream, then forward each event as it arrives.

`open_stream` waits for the upstream's first event before answering, so that a failure
before the first byte is an ordinary JSON error (raised to dispatch). After that, each
event is rendered and sent at once; a failure becomes one in-band error event and the
stream ends. Every wait for the upstream is bounded by the gateway timeout.

Metering reads `ctx.usage`, `ctx.outcome` and `ctx.response_sha256`; they are set in
the body's `finally`, so before its last message, whether it completed, failed or the
client went away. Closing the response (done in `EventStreamResponse.__call__`, shielded
from cancellation) closes the upstream connection at once.

A client that leaves is noticed by the dispatch stage, which cancels the whole exchange;
the response itself does not listen (Starlette's listener cost an anyio task group per
stream), and per-event timeouts use asyncio's own (anyio's cost ~10x more per event).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import anyio
from starlette.responses import StreamingResponse

from gateway.errors import GatewayError, InternalError, ProviderError, ProviderTimeout
from gateway.inference.tokens import estimate_tokens

log = logging.getLogger("gateway.inference")

_END: Any = object()


class Upstream:
    """An upstream event iterator whose every wait is bounded by the gateway timeout."""

    def __init__(self, events: AsyncIterator, timeout_s: float, provider: str) -> None:
        self.events = events
        self.timeout_s = timeout_s
        self.provider = provider

    async def next(self) -> Any:
        """The next event, or `_END`; ProviderTimeout when none came in time."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await anext(self.events)
        except StopAsyncIteration:
            return _END
        except TimeoutError:
            log.warning("provider %s sent nothing for %.1f s", self.provider, self.timeout_s)
            raise ProviderTimeout() from None

    async def aclose(self) -> None:
        await self.events.aclose()


class Renderer(Protocol):
    """Turns upstream events into the bytes of one client-facing SSE stream."""

    def start(self) -> bytes: ...
    def feed(self, event: Any) -> bytes: ...
    def finish(self) -> bytes: ...
    def error(self, error: GatewayError, request_id: str) -> bytes: ...
    def output_text(self) -> str: ...
    def usage(self) -> dict[str, int] | None: ...


class EventStreamResponse(StreamingResponse):
    """text/event-stream whose upstream is closed the moment the response ends, however."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncGenerator[bytes], close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(body, headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
        self._close = close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
                await self._close()


async def open_stream(
    ctx, upstream: Upstream, renderer: Renderer, prompt: str
) -> EventStreamResponse:
    """Wait for the first upstream event (errors raise as JSON), then stream the rest."""
    try:
        first = await upstream.next()
        if first is _END:
            raise ProviderError("The upstream provider sent an empty stream.")
    except BaseException:
        await upstream.aclose()
        raise
    return EventStreamResponse(_body(ctx, first, upstream, renderer, prompt), upstream.aclose)


async def _body(ctx, first, upstream: Upstream, renderer: Renderer, prompt: str):
    digest = hashlib.sha256()
    completed = False
    try:
        chunk = renderer.start()
        event = first
        while event is not _END:
            chunk += renderer.feed(event)
            if chunk:
                digest.update(chunk)
                yield chunk
            chunk = b""
            event = await upstream.next()
        chunk = renderer.finish()
        completed = True
        if chunk:
            digest.update(chunk)
            yield chunk
    except Exception as exc:
        if not isinstance(exc, GatewayError):
            log.exception("unexpected failure in a stream request_id=%s", ctx.request_id)
            exc = InternalError()
        chunk = renderer.error(exc, ctx.request_id)
        digest.update(chunk)
        yield chunk
    finally:
        _meter(ctx, renderer, prompt, digest, completed)
        await upstream.aclose()


def _meter(ctx, renderer: Renderer, prompt: str, digest, completed: bool) -> None:
    delivered = renderer.output_text()
    ctx.usage = renderer.usage() or {
        "input_tokens": estimate_tokens(prompt),
        "output_tokens": estimate_tokens(delivered),
    }
    ctx.response_sha256 = digest.hexdigest()
    if completed:
        ctx.outcome = "succeeded"
    elif delivered:
        ctx.outcome = "failed"  # output reached the client before the failure: billed
    else:
        ctx.outcome = None
