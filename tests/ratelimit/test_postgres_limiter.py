"""What only the PostgreSQL limiter has: row locks between instances, and a pruner."""

from __future__ import annotations

import asyncio
import secrets
import time

import asyncpg
import pytest

from model_gateway.storage import open_storage
from tests.ratelimit.limiters import BASE_US

pytestmark = pytest.mark.postgres


@pytest.fixture
async def storage(postgres_url):
    handle = await open_storage(postgres_url)
    yield handle
    await handle.close()


async def test_a_take_behind_another_writer_decides_on_what_that_writer_wrote(
    storage, postgres_url
):
    """Two takes of one bucket never both read the same arrival time: the second waits for
    the first's row lock, then reads the time it committed (here: the bucket spent)."""
    bucket = f"key_{secrets.token_hex(6)}"
    assert await storage.take_rate_limits([(bucket, 1, 1)], BASE_US - 120_000_000) == (0, -1)
    other = await asyncpg.connect(postgres_url)
    try:
        async with other.transaction():
            await other.execute("SELECT 1 FROM rate_buckets WHERE bucket = $1 FOR UPDATE", bucket)
            take = asyncio.ensure_future(storage.take_rate_limits([(bucket, 1, 1)], BASE_US))
            await asyncio.sleep(0.3)
            assert not take.done()  # waiting for the lock, not deciding on a stale time
            # The bucket spent as of the take's time: a whole minute owed.
            await other.execute(
                "UPDATE rate_buckets SET at_ms = $1, level = 60000 WHERE bucket = $2",
                BASE_US // 1000,
                bucket,
            )
        assert await take == (60, 0)
    finally:
        await other.close()


async def test_the_pruner_deletes_only_buckets_whose_time_is_past(storage, postgres_url):
    now_us = int(time.time() * 1_000_000)
    past, current = f"key_{secrets.token_hex(6)}", f"key_{secrets.token_hex(6)}"
    # Full again 1 s after a take of 60 rpm: 4 s ago. A take of 1 rpm owes a minute ahead.
    assert await storage.take_rate_limits([(past, 60, 1)], now_us - 5_000_000) == (0, -1)
    assert await storage.take_rate_limits([(current, 1, 1)]) == (0, -1)
    assert await storage.prune_rate_limits() >= 1
    conn = await asyncpg.connect(postgres_url)
    try:
        left = await conn.fetch(
            "SELECT bucket FROM rate_buckets WHERE bucket = ANY($1)", [past, current]
        )
    finally:
        await conn.close()
    assert [row["bucket"] for row in left] == [current]
    # A pruned bucket is a fresh one; the kept one still counts.
    assert await storage.take_rate_limits([(past, 60, 1)]) == (0, -1)
    assert (await storage.take_rate_limits([(current, 1, 1)]))[0] in (59, 60)
