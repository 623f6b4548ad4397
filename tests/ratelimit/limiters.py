"""The four rate limiters as the tests drive them: a handle that takes from buckets, and
gives back to them, at a given time (milliseconds of a test's own timeline) or, with no
time, on the limiter's clock (this process's for the in-process one, the box's for the
workers' shared one, the server's for PostgreSQL and Redis)."""

from __future__ import annotations

import asyncio
import itertools
import math
import secrets
import time
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from model_gateway.gateway.ratelimit.redis_gcra import RedisGcra
from model_gateway.gateway.ratelimit.shared_gcra import SharedGcra, create_table
from model_gateway.gateway.ratelimit.store_health import StoreHealth
from model_gateway.pipeline.gcra import Gcra
from model_gateway.pipeline.ports import Take
from model_gateway.storage import open_storage

LIMITERS = [
    pytest.param("in-process", id="in-process"),
    pytest.param("workers", id="workers"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
]

# Test timelines start a day ahead of the real clock: nothing real (a pruner, a key's
# expiry) can treat their buckets as past while a test runs.
BASE_US = (int(time.time()) + 86_400) * 1_000_000

PROPERTY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_names = itertools.count()


def fresh(kind: str) -> str:
    """A bucket no example used before (examples share one database or server)."""
    return f"{kind}_{secrets.token_hex(4)}{next(_names)}"


# A test's buckets: (name, per minute) takes one unit, (name, per minute, units) takes those.
Buckets = Sequence[tuple[str, int] | tuple[str, int, int]]


def weighted(buckets: Buckets) -> list[Take]:
    return [(b[0], b[1], b[2] if len(b) == 3 else 1) for b in buckets]  # type: ignore[misc]


class Limiter:
    """A handle's operations: `take` answers the seconds to wait (0: taken), `verdict` the
    seconds and the bucket that refused, `give_back` returns units."""

    async def take(self, buckets: Buckets, at_ms: int | None = None) -> int:
        return (await self.verdict(buckets, at_ms))[0]

    async def verdict(self, buckets: Buckets, at_ms: int | None = None) -> tuple[int, int]:
        raise NotImplementedError

    async def give_back(self, buckets: Buckets, at_ms: int | None = None) -> None:
        raise NotImplementedError


def _at_us(at_ms: int | None) -> int | None:
    return None if at_ms is None else BASE_US + at_ms * 1000


class InProcess(Limiter):
    def __init__(self) -> None:
        self.now: int | None = None
        self.gcra = Gcra(self.clock)

    def clock(self) -> int:
        return time.monotonic_ns() // 1_000_000 if self.now is None else self.now

    async def verdict(self, buckets: Buckets, at_ms: int | None = None) -> tuple[int, int]:
        self.now = at_ms
        return tuple(self.gcra.take(weighted(buckets)))  # type: ignore[return-value]

    async def give_back(self, buckets: Buckets, at_ms: int | None = None) -> None:
        self.now = at_ms
        self.gcra.give(weighted(buckets))

    async def close(self) -> None:
        pass


class Workers(InProcess):
    """A worker's handle on the table the workers of one box share (each its own map)."""

    def __init__(self, table: Path) -> None:
        super().__init__()
        self.gcra = SharedGcra(table, self.clock)

    async def close(self) -> None:
        await self.gcra.close()  # type: ignore[attr-defined]


class Postgres(Limiter):
    def __init__(self, url: str) -> None:
        self.url = url

    async def open(self) -> Postgres:
        self.storage = await open_storage(self.url)
        return self

    async def verdict(self, buckets: Buckets, at_ms: int | None = None) -> tuple[int, int]:
        return await self.storage.take_rate_limits(weighted(buckets), _at_us(at_ms))  # type: ignore[attr-defined]

    async def give_back(self, buckets: Buckets, at_ms: int | None = None) -> None:
        await self.storage.give_back_rate_limits(weighted(buckets), _at_us(at_ms))  # type: ignore[attr-defined]

    async def close(self) -> None:
        await self.storage.close()


class Redis(Limiter):
    def __init__(self, url: str, prefix: str) -> None:
        self.gcra = RedisGcra(url, prefix, StoreHealth("test Redis"))

    async def verdict(self, buckets: Buckets, at_ms: int | None = None) -> tuple[int, int]:
        return tuple(await self.gcra.take(weighted(buckets), _at_us(at_ms)))  # type: ignore[return-value]

    async def give_back(self, buckets: Buckets, at_ms: int | None = None) -> None:
        await self.gcra.give_back(weighted(buckets), _at_us(at_ms))

    async def close(self) -> None:
        await self.gcra.close()


class Reference:
    """Weighted GCRA in exact fractions of a token: what every limiter must answer."""

    def __init__(self) -> None:
        self.state: dict[str, tuple[int, Fraction]] = {}  # name: (as of ms, tokens owed)

    def _owed(self, name: str, per_minute: int, now: int) -> tuple[int, Fraction]:
        at, owed = self.state.get(name, (now, Fraction(0)))
        if now > at:
            owed = max(Fraction(0), owed - Fraction((now - at) * per_minute, 60_000))
            at = now
        return at, owed

    def take(self, buckets: list[tuple[str, int, int]], now: int) -> tuple[int, int]:
        waits_ms = []
        for name, per_minute, units in buckets:
            over = self._owed(name, per_minute, now)[1] + units - per_minute
            waits_ms.append(math.ceil(over * 60_000 / per_minute) if over > 0 else 0)
        longest = max(waits_ms)
        if longest:
            return math.ceil(Fraction(longest, 1000)), waits_ms.index(longest)
        self.give([(name, per_minute, -units) for name, per_minute, units in buckets], now)
        return 0, -1

    def give(self, buckets: list[tuple[str, int, int]], now: int) -> None:
        for name, per_minute, units in buckets:
            at, owed = self._owed(name, per_minute, now)
            self.state[name] = (at, max(Fraction(0), owed - units))

    def ready_at(self, name: str, per_minute: int, units: int, now: int) -> int:
        """The first millisecond, from `now` on, at which a take of `units` fits."""
        at, owed = self._owed(name, per_minute, now)
        over = owed + units - per_minute
        return at + max(0, math.ceil(over * 60_000 / per_minute))


GAPS = st.one_of(st.just(0), st.integers(0, 20_000))


def arrival(reference: Reference, buckets: list[Take], now: int) -> st.SearchStrategy[int]:
    """When a request arrives: the first millisecond it fits, the one before (where answers
    off by a rounding would show), or after a gap."""
    ready = max(reference.ready_at(name, limit, units, now) for name, limit, units in buckets)
    edges = sorted({ready, max(now, ready - 1)})
    return st.one_of(st.sampled_from(edges), GAPS.map(lambda gap: now + gap))


class Handles:
    """Opens handles of one limiter (several: as several instances) on a loop of the test's
    own, so sync hypothesis tests can drive them; closes them all at the end."""

    def __init__(self, kind: str, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        self.opened: list[InProcess | Postgres | Redis] = []
        if kind == "workers":
            self.table = request.getfixturevalue("tmp_path") / "ratelimit.buckets"
            create_table(self.table)
        elif kind == "postgresql":
            self.postgres_url = request.getfixturevalue("postgres_url")
        elif kind == "redis":
            self.redis_url, self.prefix = request.getfixturevalue("redis_url")

    def open(self) -> InProcess | Postgres | Redis:
        handle: InProcess | Postgres | Redis
        if self.kind == "in-process":
            handle = self.opened[0] if self.opened else InProcess()  # one process, one memory
        elif self.kind == "workers":
            handle = Workers(self.table)
        elif self.kind == "postgresql":
            handle = self.run(Postgres(self.postgres_url).open())
        else:
            handle = Redis(self.redis_url, self.prefix)
        self.opened.append(handle)
        return handle

    def first(self) -> InProcess | Postgres | Redis:
        """The handle opened first (opened now if none is): what a property test's examples
        share, so that they do not open a connection pool each (PostgreSQL's slots run out)."""
        return self.opened[0] if self.opened else self.open()

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def close(self) -> None:
        for handle in {id(h): h for h in self.opened}.values():
            self.run(handle.close())
        self.loop.close()
