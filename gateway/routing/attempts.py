"""The attempt chain of one request: the model's provider, then its fallbacks, in order.

An attempt fails over to the next provider only while nothing reached the client (a
stream is returned only once its first upstream event arrived, so every failure seen
here is before the first byte) and only for the provider's own faults
(routing.failures.RETRYABLE). Providers whose breaker is open are skipped without a
connection attempt. The hold was taken before dispatch, at the model's prices: it covers
the whole chain. Each failed attempt is logged once, with the request id.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from model_gateway.gateway.routing.failures import RETRYABLE, WORDS, reason_of
from model_gateway.gateway.telemetry.hooks import current_trace
from model_gateway.pipeline.errors import GatewayError, ServiceUnavailable

if TYPE_CHECKING:
    from starlette.responses import Response

    from model_gateway.gateway.ops.metrics import Metrics
    from model_gateway.gateway.providers import Provider, Providers
    from model_gateway.pipeline.context import RequestContext

log = logging.getLogger("gateway.routing")

# Serves the request with one provider and the upstream model name to send it.
Serve = Callable[["Provider", str], Awaitable["Response"]]


def routes(ctx: RequestContext) -> list[tuple[str, str]]:
    """(provider, upstream model name) in the order they are tried."""
    model, model_id = ctx.model, ctx.model_id
    assert model is not None and model_id is not None  # the policy stage resolved them
    first = model.upstream or model_id
    chain = [(model.provider, first)]
    chain += [(f.provider, f.upstream or first) for f in model.fallbacks]
    return chain


async def attempt_chain(
    ctx: RequestContext, providers: Providers, metrics: Metrics | None, serve: Serve
) -> Response:
    """The first answer of the chain; else the last attempt's error; else (everything
    skipped by its breaker) 503 with retry-after."""
    last_error: GatewayError | None = None
    skipped: list[int] = []
    trace = current_trace.get()  # None unless tracing is on: each attempt a span of its own
    for name, upstream in routes(ctx):
        provider = providers[name]
        if not provider.config.configured:
            continue  # a fallback without its credential: nothing to try (logged at start)
        breaker = providers.breakers[name]
        if not breaker.allow():
            skipped.append(breaker.retry_after_s())
            continue
        if metrics is not None:
            metrics.upstream_attempts.labels(name).inc()
        try:
            if trace is None:
                response = await serve(provider, upstream)
            else:
                response = await trace.attempt(ctx, provider, upstream, serve)
        except GatewayError as error:
            reason = reason_of(error)
            _failed(ctx, name, reason, error, metrics)
            if reason not in RETRYABLE:
                breaker.success()  # it answered: alive, though it refused this request
                raise
            breaker.failure()
            last_error = error
            continue
        except BaseException:
            breaker.abandoned()  # the client left, or a bug: no verdict on the provider
            raise
        if not getattr(response, "judges_at_end", False):  # a stream: see stream_ended
            breaker.success()
        ctx.provider = name
        response.headers["x-gateway-provider"] = name
        return response
    if last_error is not None:
        raise last_error
    if skipped:
        raise ServiceUnavailable(
            "Every provider of this model is failing; try again later.",
            retry_after=min(skipped),
        )
    raise ServiceUnavailable("No provider of this model is configured.")


def stream_ended(
    ctx: RequestContext,
    providers: Providers,
    metrics: Metrics | None,
    provider: str,
    error: GatewayError | None,
    *,
    abandoned: bool = False,
) -> None:
    """The verdict on the provider of a stream, given when the stream ends (not when its
    first event came: a provider that cuts every stream midway is failing). A failure
    after the first byte cannot fall back, but is the provider's as much as one before
    it: logged, counted in upstream_failures, and against the breaker when it is the
    provider's fault. `abandoned`: the client left, or a bug of ours (no verdict)."""
    trace = current_trace.get()
    if trace is not None:
        trace.stream_ended(error, abandoned=abandoned)
    breaker = providers.breakers[provider]
    if abandoned:
        breaker.abandoned()
        return
    if error is None:
        breaker.success()
        return
    reason = reason_of(error)
    _failed(ctx, provider, reason, error, metrics, when=" mid-stream")
    if reason in RETRYABLE:
        breaker.failure()
    else:
        breaker.success()


def _failed(
    ctx: RequestContext,
    provider: str,
    reason: str,
    error: GatewayError,
    metrics: Metrics | None,
    when: str = "",
) -> None:
    if metrics is not None:
        metrics.upstream_failures.labels(provider, reason).inc()
    detail = getattr(error, "detail", "") or error.status
    if reason == "credentials_rejected":
        message = "credentials rejected by provider %s (%s) request_id=%s"
        log.warning(message, provider, detail, ctx.request_id, extra=_fields(ctx, provider, reason))
        return
    log.warning(
        "provider %s failed%s: %s (%s) request_id=%s",
        provider,
        when,
        WORDS.get(reason, reason),
        detail,
        ctx.request_id,
        extra=_fields(ctx, provider, reason),
    )


def _fields(ctx: RequestContext, provider: str, reason: str) -> dict[str, dict[str, str]]:
    # Top-level keys of the JSON log line (gateway.logs.JsonFormatter).
    return {"fields": {"request_id": ctx.request_id, "provider": provider, "reason": reason}}
