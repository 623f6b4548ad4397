"""Requests and tokens per minute in PostgreSQL, exact across every instance sharing the
database.

A request's take is one item of its instance's next batch (storage/postgres/cluster.py,
migration 0020): the batch locks its buckets once, in name order, reads the database's
clock, and takes from all of a request's buckets or from none, each request decided as
alone (`rate_limit_move`, migration 0018); a request's unused tokens are given back the
same way. One round trip serves the requests of a loop turn, and a hot project's bucket
is written once per batch. A pruner, off the request path, deletes the buckets that are
full again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from model_gateway.gateway.cluster.background import stop_tasks
from model_gateway.gateway.ratelimit.store_health import StoreHealth
from model_gateway.pipeline.ports import ADMITTED, Take, Verdict
from model_gateway.storage import RateLimitPort, StorageError

log = logging.getLogger("gateway")

PRUNE_EVERY_S = 60.0


class PostgresGcra:
    def __init__(self, storage: RateLimitPort, health: StoreHealth) -> None:
        self._storage = storage
        self._health = health
        self._pruner = asyncio.get_running_loop().create_task(self._prune_forever())

    async def acquire(self, buckets: Sequence[Take]) -> Verdict:
        try:
            wait, refused = await self._storage.take_rate_limits(list(buckets))
        except StorageError as exc:
            raise self._health.failed(exc) from None
        self._health.answered()
        return Verdict(wait, refused) if wait else ADMITTED

    async def give_back(self, buckets: Sequence[Take]) -> None:
        try:
            await self._storage.give_back_rate_limits(list(buckets))
        except StorageError as exc:
            raise self._health.failed(exc) from None
        self._health.answered()

    async def _prune_forever(self) -> None:
        while True:
            await asyncio.sleep(PRUNE_EVERY_S)
            try:
                await self._storage.prune_rate_limits()
            except StorageError as exc:
                log.warning("rate limits: pruning old buckets failed (%s)", exc)

    async def close(self) -> None:
        await stop_tasks(self._pruner)
