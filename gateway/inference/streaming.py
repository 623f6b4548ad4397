"""Streams to the client: open the upstream, then forward each event as it arrives.

`open_stream` waits for the upstream's first event before answering, so that a failure
before the first byte is an ordinary JSON error (raised to dispatch). After that, each
event is rendered and sent at once; a failure becomes one in-band error event and the
stream ends. Every wait for the upstream is bounded by the gateway timeout.

Metering reads `ctx.billing`. A stream that completes or fails in-band sets it before its
terminal event ([DONE], `response.completed`, the error event), which goes out as the
final body message: settle acts on that message, so the charge is committed before the
client has the stream's end, and a charge that cannot commit cuts the stream before it.
A client that goes away gets its billing from the body's `finally`. A client that leaves
once the upstream accepted (answered 200) is billed the prompt and what it was sent,
as `cancelled`: the upstream has read the whole prompt by then. Closing the response
(done in `EventStreamResponse.__call__`, shielded from cancellation) closes the upstream
connection at once.

A client that leaves is noticed by the dispatch stage, which cancels the whole exchange;
the response itself does not listen (Starlette's listener cost an anyio task group per
stream), and the per-event timeouts share one timer a stream (wait_bound.py): asyncio's
own cost about 6.5 µs an event on uvloop, anyio's ten times that.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, Protocol, TypeVar

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from model_gateway.gateway.inference.output_limit import Delivered, past_the_limit
from model_gateway.gateway.inference.usage import Prompt, billing, cancelled
from model_gateway.gateway.inference.wait_bound import WaitBound
from model_gateway.gateway.providers.upstream import Acceptance
from model_gateway.pipeline.context import Outcome
from model_gateway.pipeline.errors import (
    GatewayError,
    InternalError,
    ProviderError,
    ProviderTimeout,
)

if TYPE_CHECKING:
    from _hashlib import HASH

    from model_gateway.pipeline.context import RequestContext

log = logging.getLogger("gateway.inference")

# An upstream event: a chunk, or a batch of checked events (one renderer reads each kind).
E = TypeVar("E")
E_contra = TypeVar("E_contra", contravariant=True)


class _End(enum.Enum):
    """The end-of-stream sentinel's type: one member, so `event is not _END` narrows."""

    END = enum.auto()


_END: Final = _End.END  # what `Upstream.next` returns once the stream ended


class StreamVerdict(Protocol):
    """The verdict on the provider of a stream, given when it ends (routing.attempts)."""

    def __call__(self, error: GatewayError | None, *, abandoned: bool = ...) -> None: ...


class Upstream(Generic[E]):
    """An upstream event iterator whose every wait is bounded by the gateway timeout."""

    def __init__(
        self,
        events: AsyncGenerator[E],
        timeout_s: float,
        provider: str,
        acceptance: Acceptance,
        ctx: RequestContext,
        ended: StreamVerdict,
    ) -> None:
        self.events = events
        self._bound = WaitBound(timeout_s)  # every wait for the next events
        self.provider = provider
        self.acceptance = acceptance  # marked by the provider when the upstream answers 2xx
        self.ctx = ctx  # its upstream_seconds adds up the waits (the overhead histogram)
        self._ended = ended  # the verdict on the provider (routing.attempts.stream_ended)
        self._judged = False

    async def next(self) -> E | Literal[_End.END]:
        """The next event, or `_END`; ProviderTimeout when none came in time."""
        started = time.perf_counter()
        try:
            with self._bound:
                return await anext(self.events)
        except StopAsyncIteration:
            return _END
        except TimeoutError:
            log.warning("provider %s sent nothing for %.1f s", self.provider, self._bound.timeout_s)
            raise ProviderTimeout() from None
        finally:
            self.ctx.upstream_seconds += time.perf_counter() - started

    def judge(self, error: GatewayError | None, *, abandoned: bool = False) -> None:
        """Give the provider's verdict for this stream, once: None is a completed stream."""
        if not self._judged:
            self._judged = True
            self._ended(error, abandoned=abandoned)

    async def aclose(self) -> None:
        self._bound.close()
        await self.events.aclose()
        # Closed unjudged: the client left before the body ran, or the stream never opened
        # (then the attempt chain's own verdict follows; this one only frees a trial slot).
        self.judge(None, abandoned=True)


class Renderer(Protocol[E_contra]):
    """Turns upstream events into the bytes of one client-facing SSE stream."""

    def start(self) -> bytes: ...
    def feed(self, event: E_contra) -> bytes: ...
    def finish(self) -> bytes: ...
    def error(self, error: GatewayError, request_id: str) -> bytes: ...
    def usage(self) -> dict[str, Any]: ...

    @property
    def delivered(self) -> Delivered: ...


class FinalChunk(bytes):
    """A stream's last bytes, sent as the final body message (see the module docstring)."""


class EventStreamResponse(StreamingResponse):
    """text/event-stream whose upstream is closed the moment the response ends, however."""

    media_type = "text/event-stream"
    judges_at_end = True  # its upstream gives the provider's verdict (routing.attempts)
    body_iterator: AsyncGenerator[bytes]  # the stream's body (_body): closed when it ends

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        async for chunk in self.body_iterator:
            final = isinstance(chunk, FinalChunk)
            await send({"type": "http.response.body", "body": bytes(chunk), "more_body": not final})
            if final:
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def __init__(self, body: AsyncGenerator[bytes], close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(body, headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
        self._close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
                await self._close()


async def open_stream(
    ctx: RequestContext, upstream: Upstream[E], renderer: Renderer[E], prompt: Prompt
) -> EventStreamResponse:
    """Wait for the first upstream event (errors raise as JSON), then stream the rest."""
    try:
        first = await upstream.next()
        if first is _END:
            raise ProviderError("The upstream provider sent an empty stream.")
    except asyncio.CancelledError:
        if upstream.acceptance.accepted:
            ctx.billing = cancelled(prompt)  # the client left between 200 and the first event
        await upstream.aclose()
        raise
    except BaseException:
        await upstream.aclose()
        raise
    return EventStreamResponse(_body(ctx, first, upstream, renderer, prompt), upstream.aclose)


async def _body(
    ctx: RequestContext, first: E, upstream: Upstream[E], renderer: Renderer[E], prompt: Prompt
) -> AsyncGenerator[bytes]:
    digest = hashlib.sha256()
    # Until the stream completes or fails, leaving this generator means the client left
    # (cancelled at an await, or closed at a yield).
    outcome: Outcome = "cancelled"
    metered = False
    try:
        try:
            chunk = renderer.start()
            event: E | Literal[_End.END] = first
            while event is not _END:
                chunk += renderer.feed(event)
                if chunk:
                    digest.update(chunk)
                    yield chunk
                chunk = b""
                if renderer.delivered.cut:
                    raise past_the_limit()  # the event that crossed it went out cut short
                event = await upstream.next()
            chunk = renderer.finish()
            outcome = "succeeded"
            upstream.judge(None)
        except Exception as exc:
            outcome = "failed"
            if not isinstance(exc, GatewayError):
                log.exception("unexpected failure in a stream request_id=%s", ctx.request_id)
                upstream.judge(None, abandoned=True)
                exc = InternalError()
            else:  # after the first byte: no fallback, but it counts against the provider
                upstream.judge(exc)
            chunk = renderer.error(exc, ctx.request_id)
        digest.update(chunk)
        _meter(ctx, renderer, prompt, digest, outcome)
        metered = True
        yield FinalChunk(chunk)  # settled as it goes out: see the module docstring
    finally:
        if not metered:
            _meter(ctx, renderer, prompt, digest, outcome)
        await upstream.aclose()


def _meter(
    ctx: RequestContext,
    renderer: Renderer[E],
    prompt: Prompt,
    digest: HASH,
    outcome: Outcome,
) -> None:
    delivered = renderer.delivered
    if outcome == "failed" and not delivered.size:
        return  # an upstream failure before any output: the hold is released in full
    # failed: output reached the client before the failure, and is billed;
    # cancelled: the client left, and owes the prompt and what it was sent. Usage that
    # the upstream reports comes after its output, so it is used whenever it came; but
    # never an output count past the hold: a cut stream bills what it delivered.
    counts = renderer.usage()
    if delivered.cut:
        counts["output_tokens"] = None
    ctx.billing = billing(outcome, counts, prompt, delivered.size, digest.hexdigest())
