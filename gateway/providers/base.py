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

import logging
from collections.abc import AsyncIterator

import aiohttp
import orjson

from gateway.config import ProviderConfig
from gateway.errors import GatewayError, InvalidRequest, ProviderError
from gateway.inference.sse import Event, SSEDecoder

log = logging.getLogger("gateway.providers")

_CONNECT_TIMEOUT_S = 10.0


class ResponsesUnsupported(Exception):
    """The upstream has no Responses endpoint: serve the request by translating to chat."""


class Provider:
    kind: str = ""
    # True: has a Responses endpoint; False: has none; None: not known yet (try it).
    native_responses: bool | None = False

    def __init__(self, name: str, config: ProviderConfig) -> None:
        self.name = name
        self.config = config

    async def start(self) -> None:
        """Open what the provider keeps between requests."""

    async def close(self) -> None:
        """Close it."""

    async def chat(self, request: dict) -> dict:
        """One Chat Completions request, answered whole."""
        raise NotImplementedError

    def chat_stream(self, request: dict) -> AsyncIterator[dict]:
        """Chat completion chunks as they arrive, then a usage chunk when usage is known."""
        raise NotImplementedError

    async def responses(self, request: dict) -> dict:
        """One Responses request passed through, answered whole."""
        raise ResponsesUnsupported

    def responses_stream(self, request: dict) -> AsyncIterator[tuple[str, dict]]:
        """(event name, payload) pairs of a native Responses stream."""
        raise ResponsesUnsupported


def upstream_error(provider: str, status: int) -> GatewayError:
    """The gateway's error for an upstream HTTP status (the body is never looked at)."""
    log.warning("provider %s answered HTTP %d", provider, status)
    if status in (401, 403, 407, 408, 429) or status >= 500 or status < 400:
        return ProviderError()
    return InvalidRequest(f"The provider rejected the request as invalid (HTTP {status}).")


def stream_ended_early(provider: str) -> ProviderError:
    log.warning("provider %s ended a stream before it was complete", provider)
    return ProviderError("The upstream provider's stream ended before it was complete.")


def reported_error(provider: str) -> ProviderError:
    log.warning("provider %s reported an error inside its stream", provider)
    return ProviderError()


def malformed(provider: str) -> ProviderError:
    log.warning("provider %s sent a malformed response", provider)
    return ProviderError("The upstream provider sent a malformed response.")


def unreachable(provider: str, exc: BaseException) -> ProviderError:
    # The class name only: an exception's text may quote a URL or a header.
    log.warning("provider %s failed: %s", provider, type(exc).__name__)
    return ProviderError()


def parse_json(provider: str, raw: bytes | str) -> dict:
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

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S),
            auto_decompress=True,
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    def headers(self) -> dict[str, str]:
        """Credential and protocol headers for every upstream request."""
        return {}

    async def _post(
        self, path: str, body: dict, *, optional_endpoint: bool = False
    ) -> aiohttp.ClientResponse:
        """POST, and return the response only if it succeeded (the caller closes it)."""
        if self.session is None:
            raise ProviderError()
        headers = {"content-type": "application/json", **self.headers()}
        try:
            # No redirects: a credential header must never follow one to another host.
            response = await self.session.post(
                self.base_url + path,
                data=orjson.dumps(body),
                headers=headers,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError) as exc:
            raise unreachable(self.name, exc) from None
        if response.status < 300:
            return response
        response.close()  # unread: the error body is never looked at
        if optional_endpoint and response.status in self.missing_endpoint_statuses:
            raise ResponsesUnsupported
        raise upstream_error(self.name, response.status)

    async def post_json(self, path: str, body: dict, *, optional_endpoint: bool = False) -> dict:
        response = await self._post(path, body, optional_endpoint=optional_endpoint)
        try:
            raw = await response.read()
        except (aiohttp.ClientError, OSError) as exc:
            raise unreachable(self.name, exc) from None
        finally:
            response.close()
        return parse_json(self.name, raw)

    async def post_events(
        self, path: str, body: dict, *, optional_endpoint: bool = False
    ) -> AsyncIterator[Event]:
        """The upstream's SSE events as they arrive. Closing this closes the connection."""
        response = await self._post(path, body, optional_endpoint=optional_endpoint)
        decoder = SSEDecoder()
        try:
            chunks = response.content.iter_any()
            while True:
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
                except (aiohttp.ClientError, OSError) as exc:
                    raise unreachable(self.name, exc) from None
                for event in decoder.feed(chunk):
                    yield event
        finally:
            response.close()  # synchronous: the connection goes at once, even when cancelled
