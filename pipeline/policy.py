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
from model_gateway.pipeline.ports import KeyInfo, ModelCatalog, ModelInfo, ProjectInfo


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
        name = getattr(ctx.payload, "model", None)
        if name is None:
            return
        assert ctx.project is not None and ctx.endpoint is not None
        ctx.model_id, ctx.model = admit_model(
            self.catalog,
            name,
            ctx.key,
            ctx.project,
            uses_tools=ctx.payload.uses_tools,
            mode=ctx.endpoint.mode,
        )


def admit_model(
    catalog: ModelCatalog,
    name: str,
    key: KeyInfo | None,
    project: ProjectInfo,
    *,
    uses_tools: bool,
    mode: str | None = None,
) -> tuple[str, ModelInfo]:
    """The model a request names (by its id or an alias) as its id and the model, once
    this key and project may run the request on it; a GatewayError otherwise. `mode`: the
    kind of model the endpoint serves (None: any)."""
    found = catalog.resolve(name)
    if found is None:
        raise ModelNotFound(param="model")
    model_id, model = found
    if not model_allowed(model_id, key, project):
        raise ModelNotAllowed(param="model")
    if mode is not None and model.mode != mode:
        message = f"This model does not serve this endpoint (a {model.mode} model)."
        raise InvalidRequest(message, param="model")
    if uses_tools and not model.supports_tools:
        raise InvalidRequest("This model does not support tools.", param="tools")
    if not catalog.available(model):
        raise ServiceUnavailable("The model is unavailable on this deployment.")
    return model_id, model
