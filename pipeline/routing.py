"""Routing: finds the endpoint before anything looks at credentials.

Reads: method and path (less the mount's root_path). Writes: `ctx.endpoint`,
`ctx.path_params`. Rejects: 404 not_found (an unknown /v1 path points at GET /v1) and
405 method_not_allowed with an `allow` header. Public endpoints skip the key stages and
go straight to `public` (the dispatch stage).
"""

from __future__ import annotations

from gateway.errors import MethodNotAllowed, NotFound, send_error
from gateway.routes import PUBLIC, RouteTable
from pipeline.context import context_of


def route_path(scope) -> str:
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


class Routing:
    def __init__(self, app, *, table: RouteTable, public) -> None:
        self.app = app
        self.table = table
        self.public = public

    async def __call__(self, scope, receive, send) -> None:
        ctx = context_of(scope)
        path = route_path(scope)
        found = self.table.match(path)
        if found is None:
            hint = (
                " GET /v1 lists the endpoints." if path == "/v1" or path.startswith("/v1/") else ""
            )
            await send_error(
                send, NotFound("No endpoint exists at this path." + hint), ctx.request_id
            )
            return
        routes, params = found
        endpoint = routes.methods.get(scope["method"])
        if endpoint is None:
            error = MethodNotAllowed(
                f"This path supports {routes.allow} only.", headers={"allow": routes.allow}
            )
            await send_error(send, error, ctx.request_id)
            return
        ctx.endpoint = endpoint
        ctx.path_params = params
        await (self.public if endpoint.scope == PUBLIC else self.app)(scope, receive, send)
