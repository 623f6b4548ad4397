"""The one typed object that carries a request's state from stage to stage (in scope["state"])."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.config import ModelConfig
    from gateway.routes import Endpoint
    from storage.base import KeyRecord, ProjectRecord

STATE_KEY = "gateway.ctx"


@dataclass(slots=True)
class RequestContext:
    request_id: str
    endpoint: Endpoint | None = None  # set by routing
    path_params: dict[str, str] = field(default_factory=dict)
    body: bytes = b""  # set by the body limit stage
    key: KeyRecord | None = None  # set by key auth (None for a console session)
    project: ProjectRecord | None = None  # set by key auth or session auth
    payload: Any = None  # the decoded request, set by policy
    model_id: str | None = None
    model: ModelConfig | None = None
    # Metering. Reservation allocates the receipt id before dispatch; the handler reports
    # what ran; settle charges it. `outcome` None means nothing ran that can be billed.
    receipt_id: str | None = None
    reservation: Any = None
    usage: dict[str, int] | None = None  # e.g. input_tokens/output_tokens, or duration_ms
    outcome: str | None = None  # "succeeded", or "failed" for a stream cut after output
    response_sha256: str | None = None


def context_of(scope) -> RequestContext:
    return scope["state"][STATE_KEY]
