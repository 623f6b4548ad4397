"""Requests per minute in Redis (`[ratelimit] url`), exact across every instance using it.

One EVALSHA per request: the script reads Redis's clock and takes one request from every
bucket or from none, atomically (a script runs alone); each bucket's key expires once its
arrival time is past, when it would mean the same as no key. Same rule and same integer
microseconds as PostgreSQL's `rate_limit_take` (migration 0008). Keys live in one
server: a Redis Cluster would need the buckets of a request in one hash slot.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from model_gateway.gateway.ratelimit.store_health import StoreHealth

TIMEOUT_S = 1.0  # a Redis that does not answer within this costs a 503, not a hung request

# KEYS: the buckets; ARGV: their rpm in the same order, then optionally the time in µs
# (tests). Numbers stay integers below 2^53, exact in Lua's doubles; written with %.0f
# because tostring keeps only 14 digits.
TAKE = """
local now
if #ARGV > #KEYS then
  now = tonumber(ARGV[#KEYS + 1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local debt = -1
local tats = {}
for i, key in ipairs(KEYS) do
  local rpm = tonumber(ARGV[i])
  local interval = math.ceil(60000000 / rpm)
  local tat = math.max(tonumber(redis.call('GET', key) or 0), now) + interval
  tats[i] = tat
  debt = math.max(debt, tat - now - rpm * interval)
end
if debt > 0 then
  return math.ceil(debt / 1000000)
end
for i, key in ipairs(KEYS) do
  -- a second beyond its arrival time: a key never expires while it still counts
  local ttl = math.ceil((tats[i] - now) / 1000) + 1000
  redis.call('SET', key, string.format('%.0f', tats[i]), 'PX', ttl)
end
return 0
"""


class RedisGcra:
    def __init__(self, url: str, prefix: str, health: StoreHealth) -> None:
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=TIMEOUT_S,
            socket_connect_timeout=TIMEOUT_S,
            retry=Retry(NoBackoff(), 1),  # one new connection after a dropped one, no sleep
        )
        self._take = self._client.register_script(TAKE)
        self._prefix = prefix
        self._health = health

    async def check(self) -> None:
        """Say at start-up whether Redis answers; serving starts either way (503s until
        it does), so an instance may start before its Redis."""
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            self._health.failed(exc)

    async def acquire(self, buckets: Sequence[tuple[str, int]]) -> int:
        return await self.take(buckets)

    async def take(self, buckets: Sequence[tuple[str, int]], at_us: int | None = None) -> int:
        """0, or the whole seconds to wait; `at_us` replaces Redis's clock (tests)."""
        keys = [self._prefix + name for name, _ in buckets]
        args = [rpm for _, rpm in buckets] + ([] if at_us is None else [at_us])
        try:
            wait = await self._take(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise self._health.failed(exc) from None
        self._health.answered()
        return int(wait)

    async def close(self) -> None:
        await self._client.aclose()
