"""What the request path calls when tracing is on: two context variables and the small
protocols behind them, so that routing and the providers know nothing of OpenTelemetry.

Off (no `[telemetry] otlp_endpoint`), both variables stay None: the attempt chain and an
upstream request each read one and do nothing more. On, the request span layer
(request_span.py) sets `current_trace` for the whole request, and the trace sets
`current_attempt` while one upstream attempt is being made.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from starlette.responses import Response

    from model_gateway.gateway.providers.upstream import Provider
    from model_gateway.pipeline.context import RequestContext
    from model_gateway.pipeline.errors import GatewayError


class AttemptTrace(Protocol):
    """The span of one upstream attempt, as an upstream request sees it."""

    @property
    def headers(self) -> Mapping[str, str]:
        """`traceparent` (and `tracestate`) naming the attempt's span: sent upstream."""
        ...

    def answered(self, status: int) -> None:
        """The upstream's HTTP status."""
        ...

    def response_model(self, model: object) -> None:
        """The `model` a whole answer named (ignored unless a string)."""
        ...


class TracedRequest(Protocol):
    """The span of one request, as the attempt chain sees it."""

    def attempt(
        self,
        ctx: RequestContext,
        provider: Provider,
        upstream: str,
        serve: Callable[[Provider, str], Awaitable[Response]],
    ) -> Awaitable[Response]:
        """`serve(provider, upstream)` inside a span of its own (a stream's span ends at
        `stream_ended`), with `current_attempt` set while it runs."""
        ...

    def stream_ended(self, error: GatewayError | None, *, abandoned: bool) -> None:
        """The stream an attempt returned ended (None: completed)."""
        ...


current_trace: ContextVar[TracedRequest | None] = ContextVar("gateway_trace", default=None)
current_attempt: ContextVar[AttemptTrace | None] = ContextVar("gateway_attempt", default=None)
