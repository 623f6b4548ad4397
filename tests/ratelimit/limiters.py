"""The three rate limiters as the tests drive them: a handle that takes from buckets at a
given time (milliseconds of a test's own timeline) or, with no time, on the limiter's clock
(this process's for the in-process one, the server's for PostgreSQL and Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from model_gateway.gateway.ratelimit.redis_gcra import RedisGcra
from model_gateway.gateway.ratelimit.store_health import StoreHealth
from model_gateway.pipeline.gcra import Gcra
from model_gateway.storage import open_storage

LIMITERS = [
    pytest.param("in-process", id="in-process"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
]

# Test timelines start a day ahead of the real clock: nothing real (a pruner, a key's
# expiry) can treat their buckets as past while a test runs.
BASE_US = (int(time.time()) + 86_400) * 1_000_000

Buckets = Sequence[tuple[str, int]]


class InProcess:
    def __init__(self) -> None:
        self.now: float | None = None
        self.gcra = Gcra(lambda: time.monotonic() if self.now is None else self.now)

    async def take(self, buckets: Buckets, at_ms: int | None = None) -> int:
        self.now = None if at_ms is None else at_ms / 1000
        return self.gcra.take(buckets)

    async def close(self) -> None:
        pass


class Postgres:
    def __init__(self, url: str) -> None:
        self.url = url

    async def open(self) -> Postgres:
        self.storage = await open_storage(self.url)
        return self

    async def take(self, buckets: Buckets, at_ms: int | None = None) -> int:
        at_us = None if at_ms is None else BASE_US + at_ms * 1000
        return await self.storage.take_rate_limits(list(buckets), at_us)  # type: ignore[attr-defined]

    async def close(self) -> None:
        await self.storage.close()


class Redis:
    def __init__(self, url: str, prefix: str) -> None:
        self.gcra = RedisGcra(url, prefix, StoreHealth("test Redis"))

    async def take(self, buckets: Buckets, at_ms: int | None = None) -> int:
        return await self.gcra.take(buckets, None if at_ms is None else BASE_US + at_ms * 1000)

    async def close(self) -> None:
        await self.gcra.close()


class Handles:
    """Opens handles of one limiter (several: as several instances) on a loop of the test's
    own, so sync hypothesis tests can drive them; closes them all at the end."""

    def __init__(self, kind: str, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        self.opened: list[InProcess | Postgres | Redis] = []
        if kind == "postgresql":
            self.postgres_url = request.getfixturevalue("postgres_url")
        elif kind == "redis":
            self.redis_url, self.prefix = request.getfixturevalue("redis_url")

    def open(self) -> InProcess | Postgres | Redis:
        handle: InProcess | Postgres | Redis
        if self.kind == "in-process":
            handle = self.opened[0] if self.opened else InProcess()  # one process, one memory
        elif self.kind == "postgresql":
            handle = self.run(Postgres(self.postgres_url).open())
        else:
            handle = Redis(self.redis_url, self.prefix)
        self.opened.append(handle)
        return handle

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def close(self) -> None:
        for handle in {id(h): h for h in self.opened}.values():
            self.run(handle.close())
        self.loop.close()
