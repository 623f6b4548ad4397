"""Request spans: the outermost layer of the /v1 request path when tracing is on (it is
not in the chain at all when off).

Reads: the client's `traceparent` and `tracestate` (the span's parent; none: a new trace),
the response's status as it goes out, an error response's `error.type`, and at the end
the request's context, which the request id stage just inside puts in scope["state"].
Writes: one SERVER span per request, current (`hooks.current_trace`) while the request
runs, ended once the response is over (a stream's last byte). Rejects: nothing. `GET
/healthz` is not traced: probes every few seconds would bury the requests.
"""

from __future__ import annotations

import orjson
from opentelemetry.trace import SpanKind, Tracer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_gateway.gateway.ops.logs import HEALTH_PATH
from model_gateway.gateway.telemetry.conventions import PROPAGATOR
from model_gateway.gateway.telemetry.hooks import current_trace
from model_gateway.gateway.telemetry.request_trace import RequestTrace
from model_gateway.pipeline.context import STATE_KEY, RequestContext
from model_gateway.pipeline.observe import CLIENT_CLOSED_REQUEST

_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})
_MAX_ERROR_BODY = 1 << 14  # an error object is far smaller; a bigger body is not read


def _trace_context(scope: Scope) -> dict[str, str]:
    return {
        name.decode(): value.decode("latin-1")
        for name, value in scope["headers"]
        if name in _TRACE_HEADERS
    }


def _error_type(body: bytes, status: int) -> str:
    """The spec's error type of an error response (`error.type`, in OpenAI's shape and in
    Anthropic's alike); else its status, as the HTTP conventions' error.type has it."""
    try:
        error = orjson.loads(body)["error"]["type"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return str(status)
    return error if isinstance(error, str) else str(status)


class RequestSpans:
    def __init__(self, app: ASGIApp, *, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        span = self.tracer.start_span(
            method,  # renamed `{method} {route}` once routed
            context=PROPAGATOR.extract(_trace_context(scope)),
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "url.path": scope["path"],
                "url.scheme": scope.get("scheme", "http"),
            },
        )
        trace = RequestTrace(self.tracer, span)
        state = scope.setdefault("state", {})  # the request id stage puts the context here
        status = 500  # until a response starts (the request id stage answers any escape)
        sent = False
        error_body: list[bytes] | None = None  # an error response's body, to read its type

        async def send_traced(message: Message) -> None:
            nonlocal status, sent, error_body
            if message["type"] == "http.response.start":
                status = message["status"]
                error_body = [] if status >= 400 else None
            elif message["type"] == "http.response.body":
                if error_body is not None and sum(map(len, error_body)) < _MAX_ERROR_BODY:
                    error_body.append(message.get("body", b""))
                sent = not message.get("more_body", False)
            await send(message)

        token = current_trace.set(trace)
        try:
            await self.app(scope, receive, send_traced)
        finally:
            current_trace.reset(token)
            ctx: RequestContext | None = state.get(STATE_KEY)
            if ctx is not None and ctx.client_left and not sent:
                status = CLIENT_CLOSED_REQUEST  # as the access log says it (observe.py)
            error_type = None
            if error_body is not None and status != CLIENT_CLOSED_REQUEST:
                error_type = _error_type(b"".join(error_body), status)
            trace.finish(ctx, status, error_type)
