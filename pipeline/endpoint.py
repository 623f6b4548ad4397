"""What each path answers: method, required scope, request type, admission, price and handler."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from starlette.types import ASGIApp

if TYPE_CHECKING:
    from model_gateway.pipeline.context import RequestContext

# Handlers take the request's context and return an ASGI response to send.
Handler = Callable[["RequestContext"], Awaitable[ASGIApp]]
Admit = Callable[["RequestContext"], Awaitable[None]]

ANY_VALID_KEY = "any"  # needs a valid key but no particular scope
PUBLIC = "public"  # no key at all: the public chain


class Pricing(Protocol):
    """The most a request may cost (held before it runs) and what it did cost, in micro-units."""

    @property
    def kind(self) -> str: ...
    def subject(self, ctx: RequestContext) -> str: ...
    def estimate(self, ctx: RequestContext) -> int: ...
    def cost(self, ctx: RequestContext) -> int: ...


_REST = re.compile(r"\{(\w+):path\}")


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    path: str  # template, e.g. /v1/receipts/{receipt_id}
    scope: str  # a key scope, ANY_VALID_KEY or PUBLIC
    handler: Handler
    decode: Callable[[bytes], Any] | None = None  # body decoder; None: no body is read
    # Checks that need I/O, run by the admission stage before anything is reserved (e.g.
    # loading a sandbox configuration whose limits fix the price); raise a GatewayError.
    admit: Admit | None = None
    pricing: Pricing | None = None  # None: free, nothing is reserved
    mode: str | None = None  # the kind of model it serves (ModelInfo.mode); None: any
    listed: bool = True  # shown by GET /v1
    # The parameters that take the rest of the path, slashes included (model ids such as
    # org/model). Written `{name:path}` in the template, which keeps only `{name}`: the
    # path is what GET /v1, metrics labels and receipts show.
    rest: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        rest = _REST.findall(self.path)
        if rest:
            object.__setattr__(self, "rest", frozenset(rest))
            object.__setattr__(self, "path", _REST.sub(r"{\1}", self.path))


@dataclass(slots=True)
class PathRoutes:
    pattern: re.Pattern[str] | None
    methods: dict[str, Endpoint] = field(default_factory=dict)

    @property
    def allow(self) -> str:
        return ", ".join(sorted(self.methods))


class RouteTable:
    """Exact paths by dictionary lookup; templated ones by regex, tried in order.

    A parameter of `Endpoint.rest` may hold slashes (model ids such as `org/model`).
    """

    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints
        self._exact: dict[str, PathRoutes] = {}
        self._templated: list[PathRoutes] = []
        by_path: dict[str, PathRoutes] = {}
        for ep in endpoints:
            routes = by_path.get(ep.path)
            if routes is None:
                pattern = _pattern(ep)
                routes = by_path[ep.path] = PathRoutes(pattern)
                if pattern:
                    self._templated.append(routes)
                else:
                    self._exact[ep.path] = routes
            routes.methods[ep.method] = ep

    def match(self, path: str) -> tuple[PathRoutes, dict[str, str]] | None:
        routes = self._exact.get(path)
        if routes is not None:
            return routes, {}
        for routes in self._templated:
            assert routes.pattern is not None
            found = routes.pattern.match(path)
            if found:
                return routes, found.groupdict()
        return None


def _pattern(ep: Endpoint) -> re.Pattern[str] | None:
    """The regex of a templated path; None for an exact one."""
    if "{" not in ep.path:
        return None

    def parameter(found: re.Match[str]) -> str:
        name = found[1]
        return f"(?P<{name}>.+)" if name in ep.rest else f"(?P<{name}>[^/]+)"

    return re.compile("^" + re.sub(r"\{(\w+)\}", parameter, ep.path) + "$")
