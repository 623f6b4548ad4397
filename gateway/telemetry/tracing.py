"""Tracing on: the OpenTelemetry SDK, its OTLP/HTTP exporter, and the two places the
request path is traced from (the request span layer, the settlement's meter).

Imported by `open_gateway` only when `[telemetry] otlp_endpoint` is set: the SDK and the
exporter (protobuf, requests) cost ~0.1 s of import, which neither the CLI nor an
untraced gateway pays. Only that setting turns export on; the standard `OTEL_*`
variables refine it as the SDK reads them (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
OTEL_EXPORTER_OTLP_HEADERS / _TIMEOUT / _COMPRESSION, OTEL_TRACES_SAMPLER, OTEL_BSP_*),
but the endpoint is always `<otlp_endpoint>/v1/traces`, whatever
OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT says. The tracer provider is this gateway's own, not
the process-wide one: a host app's tracing is left alone.
"""

from __future__ import annotations

import asyncio

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from starlette.types import ASGIApp

from model_gateway.gateway.telemetry.request_span import RequestSpans
from model_gateway.gateway.telemetry.settlement_span import TracedMeter
from model_gateway.pipeline.ports import Meter

DEFAULT_SERVICE_NAME = "model-gateway"


def traces_url(otlp_endpoint: str) -> str:
    """Where spans go: the base URL's /v1/traces, as for OTEL_EXPORTER_OTLP_ENDPOINT."""
    return otlp_endpoint.rstrip("/") + "/v1/traces"


def _resource() -> Resource:
    """OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES name the service; else model-gateway."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


class Tracing:
    def __init__(self, otlp_endpoint: str) -> None:
        self.provider = TracerProvider(resource=_resource(), shutdown_on_exit=False)
        # Batched: spans are exported by the processor's thread, off the event loop.
        exporter = OTLPSpanExporter(endpoint=traces_url(otlp_endpoint))
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("model_gateway")

    def layer(self, app: ASGIApp) -> ASGIApp:
        """`app` (the /v1 request path) with a server span around each request."""
        return RequestSpans(app, tracer=self.tracer)

    def meter(self, meter: Meter) -> Meter:
        """`meter` with a span around each settlement."""
        return TracedMeter(meter, self.tracer)

    async def shutdown(self) -> None:
        """Export what is left (bounded by the exporter's timeout), then stop."""
        await asyncio.to_thread(self.provider.shutdown)
