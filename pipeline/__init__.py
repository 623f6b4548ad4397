"""The request path. `build_pipeline` is the one place that orders the stages."""

from __future__ import annotations

from starlette.middleware import Middleware

from pipeline.body_limit import MAX_BODY_BYTES, BodyLimit
from pipeline.cors import Cors
from pipeline.dispatch import Dispatch
from pipeline.key_auth import KeyAuth
from pipeline.policy import Policy
from pipeline.rate_limit import RateLimit
from pipeline.request_id import RequestId
from pipeline.reservation import Reservation
from pipeline.routing import Routing
from pipeline.scope import Scope
from pipeline.settle import Settle


def build_pipeline(gateway, *, authenticate: Middleware | None = None):
    """The whole chain, outermost first. A stage that answers itself stops the chain.

    `authenticate` swaps key auth for another principal (the console playground uses a
    signed-in session and keeps every other stage).
    """
    config = gateway.config
    dispatch = Dispatch()
    # Metering is off only for benchmarks that measure what it costs.
    metering = [
        Middleware(Reservation, meter=gateway.meter),  # 402: hold the most the request can cost
        Middleware(Settle, meter=gateway.meter),  # on the way out: charge actual, free the rest
    ]
    stages = [
        Middleware(RequestId),  # req_ id on every response; last-resort internal_error
        Middleware(Cors, origins=config.server.cors_origins),
        Middleware(Routing, table=gateway.routes, public=dispatch),  # 404/405 before credentials
        Middleware(BodyLimit, max_bytes=MAX_BODY_BYTES),  # JSON content type, 2 MiB as it streams
        authenticate or Middleware(KeyAuth, keyring=gateway.keyring),  # 401 / archived 403
        Middleware(Scope),  # 403 insufficient_scope
        Middleware(Policy, catalog=gateway.catalog),  # decode + model rules: 400/403/404/503
        Middleware(
            RateLimit,
            limiter=gateway.limiter,
            default_key_rpm=config.limits.default_key_rpm,
            default_project_rpm=config.limits.default_project_rpm,
        ),  # 429 with retry-after
        *(metering if config.metering.enabled else []),
    ]
    app = dispatch  # terminal: runs the endpoint's handler
    for cls, args, kwargs in reversed(stages):
        app = cls(app, *args, **kwargs)
    return app
