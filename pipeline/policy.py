"""Policy: is this request valid, and may this project run it on this model.

Reads: `ctx.body`, `ctx.endpoint.decode`, `ctx.key`, `ctx.project`. Writes: `ctx.payload`,
`ctx.model_id`, `ctx.model`. Rejects: 400 invalid_request with `param` (shape, image
inputs, tools to a model without tool support), 404 model_not_found, 403
model_not_allowed (project allowlist or exclusions, key's models), 503
service_unavailable (model marked unavailable, or its provider not configured).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.pipeline.context import RequestContext, request_context
from model_gateway.pipeline.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotAllowed,
    ModelNotFound,
    ServiceUnavailable,
    send_error,
)
from model_gateway.pipeline.ports import KeyInfo, ModelCatalog, ProjectInfo


def model_allowed(model_id: str, key: KeyInfo | None, project: ProjectInfo) -> bool:
    """The project's allowlist and exclusions, then the key's own models."""
    if project.allow_models is not None and model_id not in project.allow_models:
        return False
    if model_id in project.exclude_models:
        return False
    return key is None or key.models is None or model_id in key.models


class Policy:
    def __init__(self, app: ASGIApp, *, catalog: ModelCatalog) -> None:
        self.app = app
        self.catalog = catalog

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None:  # not one of the chain's requests: passed on untouched
            await self.app(scope, receive, send)
            return
        assert ctx.endpoint is not None
        if ctx.endpoint.decode is not None:
            try:
                ctx.payload = ctx.endpoint.decode(ctx.body)
                self._admit_model(ctx)
            except GatewayError as error:
                await send_error(send, error, ctx.request_id)
                return
        await self.app(scope, receive, send)

    def _admit_model(self, ctx: RequestContext) -> None:
        model_id = getattr(ctx.payload, "model", None)
        if model_id is None:
            return
        assert ctx.project is not None
        model = self.catalog.get(model_id)
        if model is None:
            raise ModelNotFound(param="model")
        if not model_allowed(model_id, ctx.key, ctx.project):
            raise ModelNotAllowed(param="model")
        if ctx.payload.uses_tools and not model.supports_tools:
            raise InvalidRequest("This model does not support tools.", param="tools")
        if not self.catalog.available(model):
            raise ServiceUnavailable("The model is unavailable on this deployment.")
        ctx.model_id, ctx.model = model_id, model
