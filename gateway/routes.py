"""What each path answers: method, required scope, request type and handler."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.context import RequestContext

# Handlers take the request's context and return an ASGI response to send.
Handler = Callable[["RequestContext"], Awaitable[Any]]

ANY_VALID_KEY = "any"  # needs a valid key but no particular scope
PUBLIC = "public"  # no key at all


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    path: str  # template, e.g. /v1/receipts/{receipt_id}
    scope: str  # a key scope, ANY_VALID_KEY or PUBLIC
    handler: Handler
    decode: Callable[[bytes], Any] | None = None  # body decoder; None: no body is read
    # Checks that need storage, run by policy before anything is reserved (e.g. loading a
    # sandbox configuration whose limits fix the price); raise a GatewayError to refuse.
    admit: Callable[[RequestContext], Awaitable[None]] | None = None
    pricing: Any = None  # estimate/cost of a metered endpoint (gateway.pricing); None: free
    listed: bool = True  # shown by GET /v1


@dataclass(slots=True)
class _PathRoutes:
    pattern: re.Pattern | None
    methods: dict[str, Endpoint] = field(default_factory=dict)

    @property
    def allow(self) -> str:
        return ", ".join(sorted(self.methods))


class RouteTable:
    """Exact paths by dictionary lookup; templated ones by regex, tried in order."""

    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints
        self._exact: dict[str, _PathRoutes] = {}
        self._templated: list[_PathRoutes] = []
        by_path: dict[str, _PathRoutes] = {}
        for ep in endpoints:
            routes = by_path.get(ep.path)
            if routes is None:
                pattern = None
                if "{" in ep.path:
                    pattern = re.compile(
                        "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", ep.path) + "$"
                    )
                routes = by_path[ep.path] = _PathRoutes(pattern)
                if pattern:
                    self._templated.append(routes)
                else:
                    self._exact[ep.path] = routes
            routes.methods[ep.method] = ep

    def match(self, path: str) -> tuple[_PathRoutes, dict[str, str]] | None:
        routes = self._exact.get(path)
        if routes is not None:
            return routes, {}
        for routes in self._templated:
            found = routes.pattern.match(path)
            if found:
                return routes, found.groupdict()
        return None
