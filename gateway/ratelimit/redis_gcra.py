"""Requests and tokens per minute in Redis (`[ratelimit] url`), exact across every instance
using it.

One EVALSHA per request (and one more for a request's unused tokens): the script reads
Redis's clock and moves units into every bucket, a take into all of them or none,
atomically (a script runs alone). A bucket is a string "at_ms:level" (the rule of
pipeline/gcra.py, the same whole numbers as PostgreSQL's `rate_limit_move`, migration
0018), expiring a second after it is full again, when it would mean the same as no key; a
bucket given back to full is deleted. Keys live in one server: a Redis Cluster would need
the buckets of a request in one hash slot.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from model_gateway.gateway.ratelimit.store_health import StoreHealth
from model_gateway.pipeline.ports import ADMITTED, Take, Verdict

TIMEOUT_S = 1.0  # a Redis that does not answer within this costs a 503, not a hung request

# KEYS: the buckets; ARGV: 1 for a settlement (forced, whatever the buckets owe) or 0 for a
# take, then each bucket's units per minute and units, then optionally the time in µs
# (tests). Numbers stay integers below 2^53, exact in Lua's doubles (a level is at most
# about twice a minute's units times 60000); written with %.0f because tostring keeps
# only 14 digits. Returns {wait in whole seconds, 0-based index of the bucket that waits
# longest}: {0, -1} when moved.
MOVE = """
local n = #KEYS
local forced = ARGV[1] == '1'
local now
if #ARGV > 2 * n + 1 then
  now = math.floor(tonumber(ARGV[2 * n + 2]) / 1000)
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local ats, levels = {}, {}
local longest, refused = 0, -1
for i, key in ipairs(KEYS) do
  local per_minute = tonumber(ARGV[2 * i])
  local units = tonumber(ARGV[2 * i + 1])
  local at, level = now, 0
  local held = redis.call('GET', key)
  if held then
    local a, l = string.match(held, '^(%d+):(%d+)$')
    at, level = tonumber(a), tonumber(l)
    if now > at then
      local elapsed = math.min(now - at, math.ceil(level / per_minute))
      level = math.max(0, level - elapsed * per_minute)
      at = now
    end
  end
  ats[i], levels[i] = at, level
  local over = level + (units - per_minute) * 60000
  if not forced and over > 0 and math.ceil(over / per_minute) > longest then
    longest = math.ceil(over / per_minute)
    refused = i - 1
  end
end
if longest > 0 then
  return {math.ceil(longest / 1000), refused}
end
for i, key in ipairs(KEYS) do
  local per_minute = tonumber(ARGV[2 * i])
  local level = math.max(0, levels[i] + tonumber(ARGV[2 * i + 1]) * 60000)
  if level == 0 then
    redis.call('DEL', key)
  else
    -- a second beyond the time it is full again: a key never expires while it still counts
    local ttl = ats[i] + math.ceil(level / per_minute) - now + 1000
    redis.call('SET', key, string.format('%.0f:%.0f', ats[i], level), 'PX', ttl)
  end
end
return {0, -1}
"""


class RedisGcra:
    def __init__(self, url: str, prefix: str, health: StoreHealth) -> None:
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=TIMEOUT_S,
            socket_connect_timeout=TIMEOUT_S,
            retry=Retry(NoBackoff(), 1),  # one new connection after a dropped one, no sleep
        )
        self._move = self._client.register_script(MOVE)
        self._prefix = prefix
        self._health = health

    async def check(self) -> None:
        """Say at start-up whether Redis answers; serving starts either way (503s until
        it does), so an instance may start before its Redis."""
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            self._health.failed(exc)

    async def acquire(self, buckets: Sequence[Take]) -> Verdict:
        return await self.take(buckets)

    async def take(self, buckets: Sequence[Take], at_us: int | None = None) -> Verdict:
        """Take the units from every bucket or from none; `at_us` replaces Redis's clock
        (tests)."""
        wait, refused = await self._run(buckets, False, at_us)
        return Verdict(wait, refused) if wait else ADMITTED

    async def give_back(self, buckets: Sequence[Take], at_us: int | None = None) -> None:
        """Give the units back to every bucket (negative units: take them)."""
        await self._run([(name, limit, -units) for name, limit, units in buckets], True, at_us)

    async def _run(
        self, buckets: Sequence[Take], forced: bool, at_us: int | None
    ) -> tuple[int, int]:
        keys = [self._prefix + name for name, _, _ in buckets]
        args = [int(forced)]
        for _, limit, units in buckets:
            args += (limit, units)
        if at_us is not None:
            args.append(at_us)
        try:
            wait, refused = await self._move(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise self._health.failed(exc) from None
        self._health.answered()
        return int(wait), int(refused)

    async def close(self) -> None:
        await self._client.aclose()
