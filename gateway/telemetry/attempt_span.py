"""The span of one upstream attempt (each fallback its own): a CLIENT span named as the
GenAI conventions name an inference call, `{operation} {upstream model}`, whose context
every HTTP request of the attempt carries upstream as `traceparent`."""

from __future__ import annotations

from opentelemetry.trace import Span, set_span_in_context

from model_gateway.gateway.routing.failures import reason_of
from model_gateway.gateway.telemetry.conventions import PROPAGATOR, mark_error
from model_gateway.pipeline.errors import GatewayError


class AttemptSpan:
    __slots__ = ("headers", "model", "provider_kind", "span")

    def __init__(self, span: Span, provider_kind: str) -> None:
        self.span = span
        self.provider_kind = provider_kind
        self.headers: dict[str, str] = {}
        PROPAGATOR.inject(self.headers, context=set_span_in_context(span))
        self.model: str | None = None  # the model the upstream's answer named

    def answered(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)

    def response_model(self, model: object) -> None:
        if isinstance(model, str):
            self.model = model
            self.span.set_attribute("gen_ai.response.model", model)

    def end(self, error: GatewayError | None, *, abandoned: bool = False) -> None:
        """succeeded; failed (the spec's error type, and the routing's reason for it); or
        abandoned: the client left, or the gateway failed, with no verdict on the provider."""
        if abandoned:
            self.span.set_attribute("gateway.outcome", "abandoned")
        elif error is None:
            self.span.set_attribute("gateway.outcome", "succeeded")
        else:
            outcome = {"gateway.outcome": "failed", "gateway.failure_reason": reason_of(error)}
            self.span.set_attributes(outcome)
            mark_error(self.span, error.type)
        self.span.end()
