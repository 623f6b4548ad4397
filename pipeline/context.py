"""The one typed object that carries a request's state from stage to stage (in scope["state"]).

Each field has one writer, named beside it; every other stage only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from starlette.types import Scope

if TYPE_CHECKING:
    from model_gateway.pipeline.endpoint import Endpoint
    from model_gateway.pipeline.hold import Hold
    from model_gateway.pipeline.ports import KeyInfo, ModelInfo, ProjectInfo

STATE_KEY = "gateway.ctx"

# succeeded; failed: a stream cut after it delivered output; cancelled: the client left
# after the upstream (or the sandbox) had started work. Each is billed for what ran.
Outcome = Literal["succeeded", "failed", "cancelled"]
# provider: the usage the upstream reported; gateway: the gateway's own count, because the
# upstream's was missing or not a non-negative integer.
UsageSource = Literal["provider", "gateway"]


@dataclass(slots=True)
class Billing:
    """What ran, as the handler reports it; settle turns it into a charge and a receipt."""

    outcome: Outcome
    usage: dict[str, int]  # e.g. input_tokens/output_tokens, or duration_ms
    response_sha256: str | None = None
    usage_source: UsageSource = "provider"


class Settlement(msgspec.Struct, frozen=True):
    """Everything the meter needs to charge a request and write its receipt. (A msgspec
    struct, made once a metered request: 0.7 µs, where a frozen dataclass's __init__, one
    object.__setattr__ a field, took 3.9.)"""

    receipt_id: str
    request_id: str
    kind: str  # the pricing's kind: inference | sandbox
    endpoint: str  # path template
    subject: str  # model id or runtime
    status: Outcome
    usage: dict[str, int]
    cost: int  # micro-units, already capped at the hold
    request_body: bytes
    response_sha256: str | None
    usage_source: UsageSource = "provider"
    provider: str | None = None  # who served, when the handler said


@dataclass(slots=True)
class RequestContext:
    request_id: str  # request id stage
    endpoint: Endpoint | None = None  # routing
    path_params: dict[str, str] = field(default_factory=dict)  # routing
    body: bytes = b""  # body limit
    key: KeyInfo | None = None  # key auth (None for a console session)
    project: ProjectInfo | None = None  # key auth or session auth
    payload: Any = None  # policy: the decoded request, of the endpoint's own type
    model_id: str | None = None  # policy
    model: ModelInfo | None = None  # policy
    rate_limited: str | None = None  # rate limit: the limit that refused, "rpm" or "tpm"
    receipt_id: str | None = None  # reservation: allocated before dispatch (x-receipt-id)
    hold: Hold | None = None  # reservation, which also closes it on every exit path
    billing: Billing | None = None  # the handler; None: nothing billable ran
    provider: str | None = None  # the handler: the provider (or node) that served
    upstream_seconds: float = 0.0  # the handler: time spent waiting on the upstream or node
    # dispatch: the client disconnected (or the server said so once the response was sent:
    # observe tells them apart). Before: logged 499, a receipt not yet settled `cancelled`.
    client_left: bool = False
    user: str | None = None  # console session auth: the signed-in user's email (access log)


def request_context(scope: Scope) -> RequestContext | None:
    """The context of one of the chain's requests; None for a scope that is not a request
    (a websocket, a lifespan), which a stage passes to its inner app untouched, as
    Starlette's middleware do. An HTTP request without the context (a host that left out
    the request id stage) fails closed: a stage that authenticates never lets it pass."""
    if scope["type"] != "http":
        return None
    return context_of(scope)


def context_of(scope: Scope) -> RequestContext:
    try:
        ctx: RequestContext = scope["state"][STATE_KEY]
    except KeyError:
        raise RuntimeError("a request reached a stage without the request id stage") from None
    return ctx
