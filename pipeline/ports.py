"""What the stages need from outside, as small protocols the host application implements.

The gateway implements them over its storage and configuration (`gateway.keyring`,
`gateway.metering`, `gateway.catalog`); `pipeline.memory` implements them in memory for
tests and for hosts that embed the chain without a database. Both pass one contract suite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from model_gateway.pipeline.context import RequestContext, Settlement


class KeyInfo(Protocol):
    """What the stages read of an API key."""

    @property
    def id(self) -> str: ...
    @property
    def scopes(self) -> frozenset[str]: ...
    @property
    def models(self) -> list[str] | None: ...  # None: every model the project allows
    @property
    def rpm(self) -> int | None: ...  # None: the configured default
    @property
    def tpm(self) -> int | None: ...  # tokens per minute; None: no token limit


class ProjectInfo(Protocol):
    """What the stages read of the project a request is attributed to."""

    @property
    def id(self) -> str: ...
    @property
    def rpm(self) -> int | None: ...
    @property
    def tpm(self) -> int | None: ...
    @property
    def allow_models(self) -> list[str] | None: ...
    @property
    def exclude_models(self) -> list[str]: ...


class KeyLookup(Protocol):
    async def authenticate(self, presented: str) -> tuple[KeyInfo, ProjectInfo]:
        """The key and its project; raise InvalidApiKey (unknown, revoked, expired, wrong
        secret: one message for all) or Forbidden (archived project), or ServiceUnavailable
        when it cannot vouch that its answer is current (an instance that lost its lease)."""
        ...


class FallbackInfo(Protocol):
    """Another provider that serves a model when the ones before it fail."""

    @property
    def provider(self) -> str: ...
    @property
    def upstream(self) -> str | None: ...  # None: the model's own upstream name


class ModelInfo(Protocol):
    """What the stages read of a model (`supports_tools`), and what the gateway's inference
    endpoints read: its prices, output limit and the providers that serve it (a host's own
    endpoints may ignore those; `pipeline.memory.Model` leaves them unset)."""

    @property
    def supports_tools(self) -> bool: ...
    @property
    def mode(self) -> str: ...  # the endpoints it serves: "chat" or "embedding"
    @property
    def input_price_per_mtok(self) -> int | None: ...  # micro-units; None: not priced
    @property
    def output_price_per_mtok(self) -> int | None: ...
    @property
    def max_output_tokens(self) -> int: ...
    @property
    def provider(self) -> str: ...
    @property
    def upstream(self) -> str | None: ...  # the name sent to the provider; None: the id
    @property
    def fallbacks(self) -> Sequence[FallbackInfo]: ...


class ModelCatalog(Protocol):
    def resolve(self, name: str) -> tuple[str, ModelInfo] | None:
        """The model a request names, by its id or one of its aliases: (its id, it)."""
        ...

    def available(self, model: ModelInfo) -> bool: ...


# A bucket as a request takes from it: (its name, its units per minute, the units taken:
# 1 a request, or a request's tokens; at most the units per minute).
Take = tuple[str, int, int]


class Verdict(NamedTuple):
    wait_s: int  # 0: taken; else the whole seconds until it would be (at least 1)
    refused: int  # the index of the bucket that waits longest; -1 when taken


ADMITTED = Verdict(0, -1)


class RateLimiter(Protocol):
    """Weighted GCRA buckets (pipeline/gcra.py says the rule every limiter follows)."""

    async def acquire(self, buckets: Sequence[Take]) -> Verdict:
        """Take the units from every bucket, or from none. A limiter that cannot decide
        raises a GatewayError (the shared store does not answer: ServiceUnavailable),
        which is the request's answer."""
        ...

    async def give_back(self, buckets: Sequence[Take]) -> None:
        """Give the units back to every bucket, never beyond a full bucket; negative units
        are taken whatever the bucket holds (a request that used more than it took).
        Raises a GatewayError when the shared store does not answer."""
        ...


class RequestObserver(Protocol):
    def request_done(
        self, ctx: RequestContext, method: str, path: str, status: int, seconds: float
    ) -> None:
        """Called once per request when its response is over (or it failed); must not raise
        and must not block: it runs on the request path."""
        ...


class Reserved(Protocol):
    """A reservation as the meter made it."""

    @property
    def id(self) -> str: ...
    @property
    def amount(self) -> int: ...  # micro-units held


class Meter(Protocol):
    """Holds and charges money. A hold runs each call in a task of its own, to its end
    whatever cancels the caller (pipeline/hold.py)."""

    async def reserve(
        self, project_id: str, key_id: str | None, amount: int, *, watched: bool = False
    ) -> Reserved:
        """Hold `amount` atomically against every limit, or raise BudgetExceeded /
        InsufficientBalance. `watched`: the client may read its project while the request
        runs (a stream, once its first byte is out), so the hold must show in `reserved`
        by the time this returns; else a meter may show it a little later (the leased
        meter: within its housekeeping turn, 50 ms)."""
        ...

    async def settle(self, reservation: Reserved, settlement: Settlement) -> None:
        """Charge the settlement (never above the hold), store its receipt and close the
        hold, atomically; raise when nothing was committed."""
        ...

    async def release(self, reservation: Reserved) -> None:
        """Close the hold without a charge, if it is still open."""
        ...
