"""The provider interface, and the HTTP plumbing the OpenAI and Anthropic providers share.

A provider speaks OpenAI Chat Completions to the gateway whatever it speaks upstream:
`chat` takes a Chat Completions request (a dict, `model` already the upstream name) and
returns a completion; `chat_stream` yields completion chunks and, last, a usage chunk
(`choices: []`, `usage: {...}`) whenever the upstream reported usage. A provider with
a native Responses endpoint also passes Responses requests through as they are.

Every upstream failure leaves here as a GatewayError (`upstream_error`); no upstream
body or credential is ever put in one. Timeouts are the caller's (one rule for all).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import aiohttp
import orjson
from aiohttp.connector import Connection

from model_gateway.gateway.config import ProviderConfig
from model_gateway.gateway.inference.sse import Event, EventTooLarge, SSEDecoder
from model_gateway.gateway.telemetry.hooks import current_attempt
from model_gateway.pipeline.errors import GatewayError, InvalidRequest, ProviderError

if TYPE_CHECKING:
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.client_reqrep import ClientRequest
    from aiohttp.tracing import Trace

    from model_gateway.gateway.inference.json_types import JSONObject
    from model_gateway.gateway.providers.anthropic.messages_events import (
        MessagesStreamEvent,
        NativeAnswer,
    )
    from model_gateway.gateway.providers.chat_events import ChatEvent
    from model_gateway.gateway.providers.responses_events import ResponsesStreamEvent

log = logging.getLogger("gateway.providers")

_CONNECT_TIMEOUT_S = 10.0
# The most a whole answer's body may hold once decoded: far above any model's answer.
MAX_ANSWER_BYTES = 16 << 20
# How long the rest of a finished stream's body is read for: the end of its chunked body
# normally comes with the last event; one that does not come only loses the connection.
DRAIN_S = 0.5


class ResponsesUnsupported(Exception):
    """The upstream has no Responses endpoint: serve the request by translating to chat."""


E = TypeVar("E")


class EventReader(Protocol[E]):
    """A stream's reader of checked events (`ChatEvents`, `NativeResponsesEvents`,
    `NativeMessagesEvents`): fed each read, it gives the events the read completed."""

    @property
    def done(self) -> bool: ...
    @property
    def complete(self) -> bool: ...
    def feed(self, read: bytes) -> tuple[list[E], GatewayError | None]: ...


class StreamTranslator(Protocol):
    """A vendor's stream events in, chat completion chunks out; `done` once it ended."""

    @property
    def done(self) -> bool: ...
    def feed(self, event: JSONObject) -> list[JSONObject]: ...


class Acceptance:
    """Whether the upstream accepted one call (answered 2xx): from then on it has read the
    prompt, so a client that leaves still owes it; before, a cancel is free."""

    __slots__ = ("accepted",)

    def __init__(self) -> None:
        self.accepted = False

    def accept(self) -> None:
        self.accepted = True


class Provider:
    kind: str = ""
    # True: has a Responses endpoint; False: has none; None: not known yet (try it).
    native_responses: bool | None = False

    def __init__(self, name: str, config: ProviderConfig) -> None:
        self.name = name
        self.config = config

    async def start(self) -> None:
        """Open what the provider keeps between requests."""

    def credential_problem(self) -> str | None:
        """Why the credentials this kind finds itself (a library's default chain, when
        the config names none) are missing, for `gateway doctor`; None: found, or
        nothing to find. Blocking: the offline doctor calls it, never a request."""
        return None

    async def close(self) -> None:
        """Close it."""

    # Each call marks its `acceptance` once the upstream accepted the request.

    async def chat(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        """One Chat Completions request, answered whole."""
        raise NotImplementedError

    def chat_stream(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[JSONObject]:
        """Chat completion chunks as they arrive, then a usage chunk when usage is known."""
        raise NotImplementedError

    # True: the upstream speaks chat itself, and `chat_events` reads its stream as it came.
    chat_pass_through = False

    def chat_events(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[list[ChatEvent]]:
        """The upstream's chat stream in batches of checked events (chat_events.ChatEvents),
        usage asked for."""
        raise NotImplementedError

    async def responses(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        """One Responses request passed through, answered whole."""
        raise ResponsesUnsupported

    async def embeddings(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        """One embeddings request in OpenAI's shape (`input` a list of strings, or of lists
        of token ids; `model` the upstream name; `dimensions` when asked), answered in
        OpenAI's shape with float vectors and `usage.prompt_tokens`."""
        raise InvalidRequest("This model's provider does not serve embeddings.", param="model")

    def responses_stream(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[list[ResponsesStreamEvent]]:
        """A native Responses stream in batches of checked events
        (responses_events.NativeResponsesEvents)."""
        raise ResponsesUnsupported

    # True: the upstream speaks Anthropic's Messages API, and /v1/messages passes through
    # it (`messages`, `messages_events`); False: it is translated to chat. `count_tokens`
    # is asked of every provider.
    native_messages = False

    async def messages(
        self, request: JSONObject, acceptance: Acceptance, beta: str | None
    ) -> NativeAnswer:
        """One Messages request passed through (`model` the upstream name; `beta` the
        client's anthropic-beta header), answered whole: its bytes, and its shape checked."""
        raise NotImplementedError

    def messages_events(
        self, request: JSONObject, acceptance: Acceptance, beta: str | None
    ) -> AsyncGenerator[list[MessagesStreamEvent]]:
        """A Messages stream passed through, in batches of checked events
        (anthropic.messages_events.NativeMessagesEvents)."""
        raise NotImplementedError

    async def count_tokens(
        self, request: JSONObject, acceptance: Acceptance, beta: str | None
    ) -> int | None:
        """The input tokens of a Messages request by the upstream's own count; None when it
        has none (the gateway then estimates)."""
        return None


class UpstreamFailure(ProviderError):
    """A provider failure (502 to the client) with the reason the operator is told and the
    routing decides on (gateway.routing.failures). `detail` is safe to log: an HTTP status
    or an exception's class name, never a body or an exception's text."""

    def __init__(self, reason: str, message: str | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.detail = detail


# Logged once per failed attempt by the caller, with the request id (routing.attempts).


def upstream_error(provider: str, status: int) -> GatewayError:
    """The gateway's error for an upstream HTTP status (the body is never looked at)."""
    detail = f"HTTP {status}"
    if status in (401, 403, 407):
        return UpstreamFailure("credentials_rejected", detail=detail)
    if status == 429:
        return UpstreamFailure("rate_limited", detail=detail)
    if status >= 500:
        return UpstreamFailure("server_error", detail=detail)
    if status == 408 or status < 400:
        return UpstreamFailure("bad_response", detail=detail)
    return InvalidRequest(f"The provider rejected the request as invalid (HTTP {status}).")


def stream_ended_early(provider: str) -> ProviderError:
    return UpstreamFailure(
        "bad_response",
        "The upstream provider's stream ended before it was complete.",
        detail="stream ended early",
    )


def reported_error(provider: str) -> ProviderError:
    return UpstreamFailure("bad_response", detail="error reported in the stream")


def malformed(provider: str) -> ProviderError:
    return UpstreamFailure(
        "bad_response", "The upstream provider sent a malformed response.", detail="malformed"
    )


async def drained(rest: AsyncIterator[object]) -> None:
    """Read what is left of a stream whose last event came, so that its connection goes
    back to the pool. What the upstream does after that event (keeps the connection
    open, resets it, sends more) is not the answer's: the client's stream ends now."""
    # Whatever it raises (TimeoutError included), the connection closes instead.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_S):
            async for _ in rest:
                pass


def unreachable(provider: str, exc: BaseException) -> ProviderError:
    # The class name only: an exception's text may quote a URL or a header.
    return UpstreamFailure("unreachable", detail=type(exc).__name__)


# Whether the current task's last upstream request went out on a pooled connection (set
# by _PoolConnector.connect, which runs in the task that sends the request).
_REUSED: ContextVar[bool] = ContextVar("upstream_connection_reused", default=False)


class _PoolConnector(aiohttp.TCPConnector):
    """A pooling connector that tells `_post` whether a request's connection was reused.

    (A trace config did this before; any trace config makes aiohttp build and send ~10
    trace events per request, a few % of a request's CPU.)"""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # The protocols that carried a request.
        self._served: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's)
    ) -> Connection:
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        assert protocol is not None  # a new connection's: released ones have none
        _REUSED.set(protocol in self._served)
        self._served.add(protocol)
        return connection


# What a request on a connection the upstream had already closed fails with.
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def parse_json(provider: str, raw: bytes | str) -> JSONObject:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise malformed(provider) from None
    if not isinstance(value, dict):
        raise malformed(provider)
    return value


class HttpProvider(Provider):
    """An upstream reached over HTTP through one pooled aiohttp session."""

    missing_endpoint_statuses = frozenset({404, 405, 501})

    def __init__(self, name: str, config: ProviderConfig) -> None:
        super().__init__(name, config)
        self.base_url = (config.base_url or "").rstrip("/")
        self.session: aiohttp.ClientSession | None = None
        # One-shot connections for the retry after a stale pooled one (see `_send`).
        self.fresh_session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S)
        self.session = aiohttp.ClientSession(
            connector=_PoolConnector(limit=0, ttl_dns_cache=300),
            timeout=timeout,
            auto_decompress=True,
        )
        self.fresh_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True),
            timeout=timeout,
            auto_decompress=True,
        )

    async def close(self) -> None:
        for session in (self.session, self.fresh_session):
            if session is not None:
                await session.close()
        self.session = self.fresh_session = None

    def headers(self) -> dict[str, str]:
        """Credential and protocol headers for every upstream request."""
        return {}

    async def signed_headers(self, url: str, data: bytes) -> dict[str, str]:
        """The headers that authenticate one request: `headers()`, unless the kind signs
        each request (bedrock) or fetches a token first (vertex)."""
        return self.headers()

    async def failure(self, response: aiohttp.ClientResponse) -> GatewayError:
        """The gateway's error for an upstream's refusal (the caller closes `response`).
        By its status alone; a kind whose vendor says "bad credentials" another way
        (Gemini's 400 API_KEY_INVALID) reads that much of the body, never more."""
        return upstream_error(self.name, response.status)

    async def _post(
        self,
        path: str,
        body: JSONObject,
        acceptance: Acceptance,
        *,
        optional_endpoint: bool = False,
        extra_headers: Mapping[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        """POST, and return the response only if it succeeded (the caller closes it).
        `extra_headers`: this request's own (a client's anthropic-beta, say)."""
        if self.session is None:
            raise ProviderError()
        data = orjson.dumps(body)
        url = self.base_url + path
        attempt = current_attempt.get()  # None unless tracing is on (telemetry/hooks.py)
        headers = {
            "content-type": "application/json",
            **self.config.headers,
            **(extra_headers or {}),
            **(attempt.headers if attempt is not None else {}),  # the attempt span's traceparent
            **await self.signed_headers(url, data),
        }
        _REUSED.set(False)
        try:
            response = await self._send(self.session, url, data, headers)
        except _STALE as exc:
            if not _REUSED.get() or isinstance(exc, aiohttp.ClientConnectorError):
                raise unreachable(self.name, exc) from None
            # A pooled connection the upstream had closed while it sat idle: the request
            # never reached a live server. Once, on a new connection; not a failure.
            log.info("provider %s: pooled connection was stale; retrying on a fresh one", self.name)
            try:
                response = await self._send(self.fresh_session, url, data, headers)
            except (aiohttp.ClientError, OSError) as exc:
                raise unreachable(self.name, exc) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise unreachable(self.name, exc) from None
        if attempt is not None:
            attempt.answered(response.status)
        if response.status < 300:
            acceptance.accept()
            return response
        try:
            if optional_endpoint and response.status in self.missing_endpoint_statuses:
                raise ResponsesUnsupported
            raise await self.failure(response)
        finally:
            response.close()  # the error body is never passed on

    async def _send(
        self,
        session: aiohttp.ClientSession | None,
        url: str,
        data: bytes,
        headers: dict[str, str],
    ) -> aiohttp.ClientResponse:
        if session is None:
            raise ProviderError()
        # No redirects: a credential header must never follow one to another host.
        return await session.post(
            url,
            data=data,
            headers=headers,
            allow_redirects=False,
        )

    async def post_json(
        self,
        path: str,
        body: JSONObject,
        acceptance: Acceptance,
        *,
        optional_endpoint: bool = False,
        extra_headers: Mapping[str, str] | None = None,
    ) -> JSONObject:
        response = await self._post(
            path, body, acceptance, optional_endpoint=optional_endpoint, extra_headers=extra_headers
        )
        try:
            raw = await self._answer(response)
        except (aiohttp.ClientError, OSError) as exc:
            raise unreachable(self.name, exc) from None
        finally:
            response.close()
        answer = parse_json(self.name, raw)
        attempt = current_attempt.get()
        if attempt is not None:
            attempt.response_model(answer.get("model"))  # gen_ai.response.model, when named
        return answer

    async def _answer(self, response: aiohttp.ClientResponse) -> bytes:
        """A whole answer's body, at most MAX_ANSWER_BYTES once decoded: read at once when
        its length says it fits, else counted as it comes (chunked, or compressed: a small
        gzip can decode to gigabytes)."""
        length = response.content_length
        if (
            length is not None
            and length <= MAX_ANSWER_BYTES
            and not response.headers.get("content-encoding")
        ):
            return await response.read()
        chunks, size = [], 0
        async for chunk in response.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise malformed(self.name)
            chunks.append(chunk)
        return b"".join(chunks)

    async def post_stream(
        self,
        path: str,
        body: JSONObject,
        acceptance: Acceptance,
        *,
        optional_endpoint: bool = False,
        extra_headers: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[bytes]:
        """The upstream's body as it arrives, one item per read. Closing this closes the
        connection."""
        response = await self._post(
            path, body, acceptance, optional_endpoint=optional_endpoint, extra_headers=extra_headers
        )
        try:
            reads = response.content.iter_any()
            while True:
                try:
                    read = await anext(reads)
                except StopAsyncIteration:
                    return
                except (aiohttp.ClientError, OSError) as exc:
                    raise unreachable(self.name, exc) from None
                yield read
        finally:
            response.close()  # synchronous: the connection goes at once, even when cancelled

    async def batches(
        self, reads: AsyncGenerator[bytes], events: EventReader[E]
    ) -> AsyncGenerator[list[E]]:
        """One batch of checked events per read; the upstream's failure raised after the
        good events before it; an early end raised once the connection is read out."""
        async with contextlib.aclosing(reads):
            async for read in reads:
                batch, failure = events.feed(read)
                if batch:
                    yield batch
                if failure is not None:
                    raise failure
                if events.done:
                    await drained(reads)
                    break
        if not events.complete:
            raise stream_ended_early(self.name)

    async def translated_chunks(
        self,
        path: str,
        body: JSONObject,
        acceptance: Acceptance,
        translator: StreamTranslator,
        read: Callable[[str], JSONObject],
    ) -> AsyncGenerator[JSONObject]:
        """A vendor's SSE stream as chat chunks: each event's data `read` (parsed and
        checked; it raises on an in-band error) and translated; an early end raised once
        the connection is read out."""
        events = self.post_events(path, body, acceptance)
        async with contextlib.aclosing(events):
            async for event in events:
                for chunk in translator.feed(read(event.data)):
                    yield chunk
                if translator.done:
                    await drained(events)
                    break
        if not translator.done:
            raise stream_ended_early(self.name)

    async def post_events(
        self,
        path: str,
        body: JSONObject,
        acceptance: Acceptance,
        *,
        optional_endpoint: bool = False,
    ) -> AsyncGenerator[Event]:
        """The upstream's SSE events as they arrive. Closing this closes the connection."""
        decoder = SSEDecoder()
        reads = self.post_stream(path, body, acceptance, optional_endpoint=optional_endpoint)
        async with contextlib.aclosing(reads):
            async for read in reads:
                try:
                    events = decoder.feed(read)
                except EventTooLarge:
                    raise malformed(self.name) from None
                for event in events:
                    yield event
