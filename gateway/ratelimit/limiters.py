"""Which rate limiter serves: requests and tokens per minute exact across every instance of
a deployment.

`[ratelimit] url = "redis://..."`: the buckets live in Redis (redis_gcra), whatever the
storage. Otherwise in PostgreSQL when it is the storage (postgres_gcra), and with SQLite
in this process's memory, or in memory the workers of `gateway serve --workers N` share
(shared_gcra). All four are weighted GCRA with one meaning (pipeline/gcra.py,
tests/ratelimit/test_conformance.py). A shared store that does not answer gives 503
service_unavailable: never a request let through unchecked, never a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol, TypeGuard

from model_gateway.gateway.config import Config
from model_gateway.gateway.ops.summary import redacted_storage_url
from model_gateway.gateway.ops.worker_seat import WorkerSeat
from model_gateway.gateway.ratelimit.store_health import StoreHealth
from model_gateway.pipeline.gcra import Gcra
from model_gateway.pipeline.ports import Take, Verdict
from model_gateway.storage import RateLimitPort, Storage

log = logging.getLogger("gateway")


class Limiter(Protocol):
    async def acquire(self, buckets: Sequence[Take]) -> Verdict: ...
    async def give_back(self, buckets: Sequence[Take]) -> None: ...
    async def close(self) -> None: ...


class LocalGcra(Gcra):
    """SQLite served by one process: its own memory is exact."""

    async def close(self) -> None:
        """Nothing to release: the buckets go with the process."""


def _shares_rate_limits(storage: Storage) -> TypeGuard[RateLimitPort]:
    """PostgreSQL storage, which keeps the buckets (found by the method: its class is not
    imported with SQLite)."""
    return hasattr(storage, "take_rate_limits")


async def open_limiter(config: Config, storage: Storage, seat: WorkerSeat | None = None) -> Limiter:
    if config.ratelimit.url is not None:
        from model_gateway.gateway.ratelimit.redis_gcra import (
            RedisGcra,  # imports redis only if used
        )

        where = redacted_storage_url(config.ratelimit.url)
        limiter = RedisGcra(config.ratelimit.url, config.ratelimit.prefix, StoreHealth(where))
        await limiter.check()
        log.info("rate limits: shared in Redis at %s", where)
        return limiter
    if _shares_rate_limits(storage):
        from model_gateway.gateway.ratelimit.postgres_gcra import PostgresGcra

        log.info("rate limits: shared in PostgreSQL")
        return PostgresGcra(storage, StoreHealth("PostgreSQL"))
    if seat is not None:
        from model_gateway.gateway.ratelimit.shared_gcra import SharedGcra

        return SharedGcra(seat.limiter_file)
    return LocalGcra()
