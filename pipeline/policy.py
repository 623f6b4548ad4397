"""Policy: is this request valid, and may this project run it on this model.

Reads: `ctx.body`, `ctx.endpoint.decode`, `ctx.key`, `ctx.project`. Writes: `ctx.payload`,
`ctx.model_id`, `ctx.model`. Rejects: 400 invalid_request with `param` (shape, image
inputs, tools to a model without tool support), 404 model_not_found, 403
model_not_allowed (project allowlist or exclusions, key's models), 503
service_unavailable (model marked unavailable, or its provider not configured), and
whatever the endpoint's own `admit` check refuses (e.g. a foreign sandbox: 404).
"""

from __future__ import annotations

from gateway.catalog import ModelCatalog
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotAllowed,
    ModelNotFound,
    ServiceUnavailable,
    send_error,
)
from pipeline.context import context_of


class Policy:
    def __init__(self, app, *, catalog: ModelCatalog) -> None:
        self.app = app
        self.catalog = catalog

    async def __call__(self, scope, receive, send) -> None:
        ctx = context_of(scope)
        if ctx.endpoint.decode is not None:
            try:
                ctx.payload = ctx.endpoint.decode(ctx.body)
                self._admit_model(ctx)
                if ctx.endpoint.admit is not None:
                    await ctx.endpoint.admit(ctx)
            except GatewayError as error:
                await send_error(send, error, ctx.request_id)
                return
        await self.app(scope, receive, send)

    def _admit_model(self, ctx) -> None:
        model_id = getattr(ctx.payload, "model", None)
        if model_id is None:
            return
        model = self.catalog.get(model_id)
        if model is None:
            raise ModelNotFound(param="model")
        if not self.catalog.allowed(model_id, ctx.key, ctx.project):
            raise ModelNotAllowed(param="model")
        if ctx.payload.uses_tools and not model.supports_tools:
            raise InvalidRequest("This model does not support tools.", param="tools")
        if not self.catalog.available(model):
            raise ServiceUnavailable("The model is unavailable on this deployment.")
        ctx.model_id, ctx.model = model_id, model
