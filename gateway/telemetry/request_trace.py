"""One request's trace: its server span, the attempts made under it, and what the span
says once the request is over (read from the request's context, never its body)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from opentelemetry.trace import Span, SpanKind, Tracer, set_span_in_context

from model_gateway.gateway.telemetry.attempt_span import AttemptSpan
from model_gateway.gateway.telemetry.conventions import (
    OPERATIONS,
    Attributes,
    mark_error,
    provider_attributes,
    server_attributes,
    usage_attributes,
)
from model_gateway.gateway.telemetry.hooks import current_attempt
from model_gateway.pipeline.errors import GatewayError

if TYPE_CHECKING:
    from starlette.responses import Response

    from model_gateway.gateway.providers.upstream import Provider
    from model_gateway.pipeline.context import RequestContext


class RequestTrace:
    """A traced request (`hooks.TracedRequest`)."""

    __slots__ = ("attempts", "context", "served", "span", "stream_error", "streaming", "tracer")

    def __init__(self, tracer: Tracer, span: Span) -> None:
        self.tracer = tracer
        self.span = span
        self.context = set_span_in_context(span)  # the parent of its child spans
        self.attempts = 0
        self.served: AttemptSpan | None = None  # the attempt that answered
        self.streaming: AttemptSpan | None = None  # its stream, until the stream ends
        self.stream_error: str | None = None  # the error type that ended it

    async def attempt(
        self,
        ctx: RequestContext,
        provider: Provider,
        upstream: str,
        serve: Callable[[Provider, str], Awaitable[Response]],
    ) -> Response:
        self.attempts += 1
        operation = OPERATIONS.get(ctx.endpoint.path if ctx.endpoint is not None else "", "")
        attributes: Attributes = {
            "gen_ai.request.model": upstream,
            "gateway.attempt": self.attempts,
            **provider_attributes(provider.name, provider.kind),
            **server_attributes(getattr(provider, "base_url", "")),
        }
        if operation:
            attributes["gen_ai.operation.name"] = operation
        span = self.tracer.start_span(
            f"{operation or 'call'} {upstream}",
            context=self.context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        attempt = AttemptSpan(span, provider.kind)
        token = current_attempt.set(attempt)  # its requests carry its traceparent
        try:
            response = await serve(provider, upstream)
        except GatewayError as error:
            attempt.end(error)
            raise
        except BaseException:
            attempt.end(None, abandoned=True)
            raise
        finally:
            current_attempt.reset(token)
        self.served = attempt
        if getattr(response, "judges_at_end", False):  # a stream: it ends at stream_ended
            self.streaming = attempt
        else:
            attempt.end(None)
        return response

    def stream_ended(self, error: GatewayError | None, *, abandoned: bool) -> None:
        attempt, self.streaming = self.streaming, None
        if attempt is None:
            return  # a stream that never opened: the attempt chain ends its span
        if error is not None and not abandoned:
            self.stream_error = error.type
        attempt.end(error, abandoned=abandoned)

    def finish(self, ctx: RequestContext | None, status: int, error_type: str | None) -> None:
        """End the request's span with what its context says: HTTP, GenAI, ids."""
        self.stream_ended(None, abandoned=True)  # (already ended, unless a bug left it)
        span = self.span
        if ctx is None:
            span.set_attribute("http.response.status_code", status)
        else:
            span.set_attributes(_request_attributes(ctx, status, self.served))
            if ctx.endpoint is not None:
                span.update_name(f"{ctx.endpoint.method} {ctx.endpoint.path}")
        error_type = error_type or self.stream_error
        if error_type is not None:
            mark_error(span, error_type)
        span.end()


def _request_attributes(ctx: RequestContext, status: int, served: AttemptSpan | None) -> Attributes:
    attributes: Attributes = {
        "http.response.status_code": status,
        "gateway.request_id": ctx.request_id,
    }
    if ctx.endpoint is not None:
        attributes["http.route"] = ctx.endpoint.path
        operation = OPERATIONS.get(ctx.endpoint.path)
        if operation is not None:
            attributes["gen_ai.operation.name"] = operation
    asked = getattr(ctx.payload, "model", None)  # the model as the client named it
    if isinstance(asked, str) or ctx.model_id is not None:
        attributes["gen_ai.request.model"] = asked if isinstance(asked, str) else ctx.model_id
    if ctx.project is not None:
        attributes["gateway.project_id"] = ctx.project.id
    settled = ctx.hold.settlement if ctx.hold is not None else None
    if settled is not None:
        attributes["gateway.receipt_id"] = settled.receipt_id
    if ctx.provider is not None:
        attributes["gateway.provider"] = ctx.provider
    if served is not None:
        attributes.update(provider_attributes(ctx.provider or "", served.provider_kind))
        if served.model is not None:
            attributes["gen_ai.response.model"] = served.model
    if ctx.billing is not None:
        attributes.update(usage_attributes(ctx.billing.usage))
    return attributes
