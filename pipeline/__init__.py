"""The request path. `build_pipeline` is the one place that orders the stages.

The package depends on nothing of the application that embeds it: what the stages need
from outside (keys, meter, rate limiter, model catalog) are the protocols of
`pipeline.ports`, which a host implements (or takes from `pipeline.memory`).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.middleware import Middleware
from starlette.types import ASGIApp

from model_gateway.pipeline.admission import Admission
from model_gateway.pipeline.body_limit import MAX_BODY_BYTES, BodyLimit
from model_gateway.pipeline.cors import Cors
from model_gateway.pipeline.dispatch import Dispatch
from model_gateway.pipeline.endpoint import RouteTable
from model_gateway.pipeline.key_auth import KeyAuth
from model_gateway.pipeline.key_scope import KeyScope
from model_gateway.pipeline.observe import Observe
from model_gateway.pipeline.policy import Policy
from model_gateway.pipeline.ports import (
    KeyLookup,
    Meter,
    ModelCatalog,
    RateLimiter,
    RequestObserver,
)
from model_gateway.pipeline.rate_limit import RateLimit
from model_gateway.pipeline.request_id import RequestId
from model_gateway.pipeline.reservation import Reservation
from model_gateway.pipeline.routing import Routing
from model_gateway.pipeline.settle import Settle


def chain(stages: Sequence[Middleware], terminal: ASGIApp) -> ASGIApp:
    """Wrap `terminal` in `stages`, the first one outermost."""
    app = terminal
    for cls, args, kwargs in reversed(stages):
        app = cls(app, *args, **kwargs)
    return app


def keyed_stages(
    *,
    authenticate: Middleware,
    catalog: ModelCatalog,
    limiter: RateLimiter,
    meter: Meter | None,
    default_key_rpm: int,
    default_project_rpm: int,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> list[Middleware]:
    """The stages of an authenticated request, from its key to its settlement, in order."""
    # `meter` None turns metering off: only for benchmarks that measure what it costs.
    metering = []
    if meter is not None:
        metering = [
            Middleware(Reservation, meter=meter),  # 402: hold the most the request can cost
            Middleware(Settle),  # on the way out: charge actual, free the rest, write the receipt
        ]
    return [
        # Credentials first, from the headers: a client without a key never has a body read.
        authenticate,  # 401 invalid_api_key / 403 archived (or a console session)
        Middleware(KeyScope),  # 403 insufficient_scope
        Middleware(BodyLimit, max_bytes=max_body_bytes),  # JSON content type, 2 MiB as it streams
        Middleware(Policy, catalog=catalog),  # decode + model rules: 400/403/404/503
        Middleware(Admission),  # the endpoint's own checks with I/O (a sandbox: 404)
        Middleware(
            RateLimit,
            limiter=limiter,
            default_key_rpm=default_key_rpm,
            default_project_rpm=default_project_rpm,
        ),  # 429 with retry-after
        *metering,
    ]


def build_pipeline(
    *,
    routes: RouteTable,
    keys: KeyLookup,
    catalog: ModelCatalog,
    limiter: RateLimiter,
    meter: Meter | None,
    cors_origins: list[str],
    default_key_rpm: int,
    default_project_rpm: int,
    max_body_bytes: int = MAX_BODY_BYTES,
    authenticate: Middleware | None = None,
    observers: Sequence[RequestObserver] = (),
) -> ASGIApp:
    """The whole request path, outermost first. A stage that answers stops the chain.

    Two chains meet at routing: public endpoints (health, proofs) go straight to their
    handler; every other one goes through the keyed chain. `authenticate` swaps key auth
    for another principal (the console playground: a signed-in session, full scope).
    """
    keyed = chain(
        keyed_stages(
            authenticate=authenticate or Middleware(KeyAuth, keys=keys),
            catalog=catalog,
            limiter=limiter,
            meter=meter,
            default_key_rpm=default_key_rpm,
            default_project_rpm=default_project_rpm,
            max_body_bytes=max_body_bytes,
        ),
        Dispatch(),  # terminal: runs the endpoint's handler
    )
    public = chain([], Dispatch())  # no key, no body, nothing billed
    outer = [
        Middleware(RequestId),  # req_ id on every response; last-resort internal_error
        Middleware(Observe, observers=observers),  # metrics and the access log, per request
        Middleware(Cors, origins=cors_origins),
    ]
    # 404/405 before credentials, then on to the endpoint's chain
    return chain(outer, Routing(table=routes, public=public, keyed=keyed))
