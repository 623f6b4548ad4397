"""Rate limits with weighted GCRA: requests per minute and tokens per minute, one rule.

A bucket of `per_minute` units may spend its whole minute at once, then refills
`per_minute` units a minute, continuously; unlike a fixed window, it never grants a second
full minute at a boundary. A request takes `units` from it (1 for rpm; its token
estimate for tpm) and settlement may give some back. This is GCRA in its continuous-state
leaky bucket form (ITU-T I.371), kept in integers so that every limiter answers alike,
exactly: a bucket's `level` is the units it still owes times 60,000, as of `at_ms`; it
drains `per_minute` each millisecond (so a limit's change never rescales what is owed).
A take is allowed while `level + units * 60000 <= per_minute * 60000`; a give-back lowers
the level, never below 0 (a full bucket), and a negative one (a request that used more
than it took) raises it whatever it holds. Times are whole milliseconds of the limiter's
clock. The shared limiters (gateway/ratelimit: PostgreSQL, Redis) run this same rule in
their atomic unit; `Gcra` here is the in-process one: exact for one serving process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from model_gateway.pipeline.ports import ADMITTED, Take, Verdict

MINUTE_MS = 60_000
_PRUNE_EVERY = 10_000


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def drained(level: int, at_ms: int, now_ms: int, per_minute: int) -> int:
    """A bucket's level at `now_ms`: what it owed at `at_ms`, less what drained since."""
    elapsed = now_ms - at_ms
    if elapsed <= 0:
        return level
    return max(0, level - elapsed * per_minute)


def wait_ms(level: int, units: int, per_minute: int) -> int:
    """0 when a take of `units` fits a bucket at `level`, else the milliseconds until it
    would."""
    over = level + (units - per_minute) * MINUTE_MS
    return 0 if over <= 0 else -(-over // per_minute)


def empty_at(at_ms: int, level: int, per_minute: int) -> int:
    """When a bucket at `level` is full again (the same as no bucket)."""
    return at_ms + -(-level // per_minute)


class Gcra:
    def __init__(self, clock: Callable[[], int] = _monotonic_ms) -> None:
        self._clock = clock  # whole milliseconds
        # Per bucket: (at_ms, level, empty_at_ms).
        self._buckets: dict[str, tuple[int, int, int]] = {}
        self._calls = 0

    async def acquire(self, buckets: Sequence[Take]) -> Verdict:
        return self.take(buckets)

    async def give_back(self, buckets: Sequence[Take]) -> None:
        self.give(buckets)

    def take(self, buckets: Sequence[Take]) -> Verdict:
        """Take `units` from every (name, per_minute, units) bucket, or from none."""
        now = self._clock()
        longest, refused = 0, -1
        for i, (name, per_minute, units) in enumerate(buckets):
            wait = wait_ms(self._level(name, per_minute, now), units, per_minute)
            if wait > longest:
                longest, refused = wait, i
        if refused >= 0:
            return Verdict(-(-longest // 1000), refused)  # whole seconds, at least 1
        self._move(buckets, now, 1)
        self._prune(now)
        return ADMITTED

    def give(self, buckets: Sequence[Take]) -> None:
        """Give `units` back to every bucket (negative: take them, whatever it holds)."""
        self._move(buckets, self._clock(), -1)

    def _level(self, name: str, per_minute: int, now: int) -> int:
        state = self._buckets.get(name)
        return 0 if state is None else drained(state[1], state[0], now, per_minute)

    def _move(self, buckets: Sequence[Take], now: int, sign: int) -> None:
        for name, per_minute, units in buckets:
            state = self._buckets.get(name)
            if state is None:
                at, level = now, 0
            else:
                at, level = max(state[0], now), drained(state[1], state[0], now, per_minute)
            level = max(0, level + sign * units * MINUTE_MS)
            self._buckets[name] = (at, level, empty_at(at, level, per_minute))

    def _prune(self, now: int) -> None:
        self._calls += 1
        if self._calls % _PRUNE_EVERY == 0:
            # A bucket that is full again is indistinguishable from a fresh one.
            self._buckets = {k: s for k, s in self._buckets.items() if s[2] > now}
