"""What an Anthropic upstream gets of a /v1/messages request: the client's body as it
came, but the model (its upstream name) and max_tokens (within the model's), and the
client's `anthropic-beta` header.

The header is the one thing of the request the handler's context does not carry, so
the messages handlers answer with `AfterHeaders`: an ASGI app that dispatch calls with
the request's scope, which then serves the request as a handler would (a GatewayError
is the spec's error object, as dispatch answers one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.pipeline.errors import GatewayError, send_error

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject
    from model_gateway.pipeline.context import RequestContext
    from model_gateway.pipeline.ports import ModelInfo


def upstream_messages(
    request: JSONObject, model: ModelInfo, model_id: str, upstream: str | None = None
) -> JSONObject:
    """The body as the client sent it, with the upstream model name (`upstream`, for a
    fallback) and its max_tokens, when it has one, within the model's."""
    body = {**request, "model": upstream or model.upstream or model_id}
    if "max_tokens" in body:
        body["max_tokens"] = min(body["max_tokens"], model.max_output_tokens)
    return body


def anthropic_beta(headers: Headers) -> str | None:
    """The client's anthropic-beta header (several are one list), None when absent."""
    return ",".join(headers.getlist("anthropic-beta")) or None


class AfterHeaders:
    """Serves the request once dispatch hands over its scope (see the module docstring)."""

    def __init__(self, ctx: RequestContext, serve: Callable[[Headers], Awaitable[ASGIApp]]) -> None:
        self.ctx = ctx
        self.serve = serve

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await self.serve(Headers(scope=scope))
        except GatewayError as error:
            await send_error(send, error, self.ctx.request_id)
            return
        await response(scope, receive, send)
