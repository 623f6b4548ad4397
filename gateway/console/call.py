"""One console request as a handler sees it (`Call`), and what handlers and the console's
dispatch share about endpoints: a leaf, so that the handlers never import the mount."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast
from urllib.parse import parse_qsl

import orjson
from starlette.requests import Request
from starlette.responses import Response

from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import InvalidRequest
from model_gateway.storage.base import UserRecord

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject
    from model_gateway.pipeline.endpoint import Handler

SESSION = "session"  # a JSON endpoint: 401 without a session
PAGE = "page"  # an HTML page: 303 to the sign-in page without a session
MAX_BODY_BYTES = 64 * 1024


@dataclass(slots=True)
class Call:
    """One console request as a handler sees it."""

    request: Request
    user: UserRecord | None  # None only on a PUBLIC endpoint
    params: dict[str, str]
    request_id: str

    @property
    def session_user(self) -> UserRecord:
        """The signed-in user, on an endpoint that requires a session (SESSION, PAGE): the
        console's dispatch authenticates before the handler runs."""
        assert self.user is not None, "a public endpoint has no session user"
        return self.user

    async def body(self, content_type: str = "application/json") -> bytes:
        """The raw body (400 for another content type or a body over the limit)."""
        sent = self.request.headers.get("content-type", "").split(";")[0].strip()
        if sent.lower() != content_type:
            raise InvalidRequest(f"Content-Type must be {content_type}.", param="Content-Type")
        body = b""
        async for chunk in self.request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise InvalidRequest("The request body is too large.")
        return body

    async def json(self) -> JSONObject:
        body = await self.body()
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise InvalidRequest("The body is not valid JSON.") from None
        if not isinstance(value, dict):
            raise InvalidRequest("The body must be a JSON object.")
        return value

    async def form(self) -> dict[str, str]:
        """A form's fields, as a browser without JavaScript posts them (the sign-in form)."""
        body = await self.body("application/x-www-form-urlencoded")
        return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))

    def query(self, name: str) -> str | None:
        return self.request.query_params.get(name)


def no_content(headers: dict[str, str] | None = None) -> Response:
    return Response(status_code=204, headers=headers)


# A console handler: the request as a Call, the response to send.
ConsoleHandler = Callable[[Call], Awaitable[Response]]


def route(method: str, path: str, scope: str, handler: ConsoleHandler) -> Endpoint:
    """A console endpoint in the pipeline's route table (which matches its path, and whose
    template labels the request's metrics). The table's Endpoint types its handler for the
    /v1 chain, which passes a RequestContext; a console endpoint's takes a Call, and only
    the console's dispatch calls it (`handler_of`): the one place the two types meet."""
    return Endpoint(method, path, scope, cast("Handler", handler))


def handler_of(endpoint: Endpoint) -> ConsoleHandler:
    """The handler of an endpoint `route` made."""
    return cast(ConsoleHandler, endpoint.handler)
