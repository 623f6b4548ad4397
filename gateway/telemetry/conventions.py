"""The OpenTelemetry attribute names and values the spans use (GenAI and HTTP semantic
conventions), and how an error is marked: the spec's error type, nothing more.

Attributes hold names, ids, counts and statuses only: never a prompt, an output, a key or
a header's value (the spans are built from `RequestContext` fields that hold none, and an
error's message, which may quote what an upstream said, is never read).
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlsplit

from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

# W3C Trace Context, in from the client and out to each upstream, whatever OTEL_PROPAGATORS.
PROPAGATOR = TraceContextTextMapPropagator()

# gen_ai.operation.name by endpoint; others (count_tokens, sandboxes, receipts) have none.
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "chat",
    "/v1/messages": "chat",
    "/v1/embeddings": "embeddings",
}

# gen_ai.provider.name (gen_ai.system before it) by provider kind: the conventions' values.
PROVIDER_NAMES = {
    "openai": "openai",
    "azure": "azure.ai.openai",
    "anthropic": "anthropic",
    "bedrock": "aws.bedrock",
    "gemini": "gcp.gemini",
    "vertex": "gcp.vertex_ai",
}

# A settlement's usage key -> its gen_ai.usage attribute.
USAGE = (
    ("input_tokens", "gen_ai.usage.input_tokens"),
    ("output_tokens", "gen_ai.usage.output_tokens"),
    ("cached_input_tokens", "gen_ai.usage.cache_read.input_tokens"),
    ("cache_write_tokens", "gen_ai.usage.cache_creation.input_tokens"),
)

Attributes = dict[str, AttributeValue]


def provider_attributes(name: str, kind: str) -> Attributes:
    """The provider as the conventions name its vendor, and as the config names it."""
    vendor = PROVIDER_NAMES.get(kind, kind)
    return {"gen_ai.provider.name": vendor, "gen_ai.system": vendor, "gateway.provider": name}


def usage_attributes(usage: dict[str, int]) -> Attributes:
    return {name: usage[key] for key, name in USAGE if key in usage}


@lru_cache(maxsize=64)
def server_attributes(base_url: str) -> Attributes:
    """server.address and server.port of an upstream's base URL (never its path or query)."""
    if not base_url:
        return {}
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"server.address": parts.hostname or "", "server.port": port}


def mark_error(span: Span, error_type: str) -> None:
    """Span status ERROR described by the spec's error type alone (no message, no stack)."""
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, error_type))
