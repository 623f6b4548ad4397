"""Requests per minute with GCRA: smooth, O(1) memory per bucket, no fixed-window edge.

A bucket of `rpm` may spend its whole minute at once, then refills one request every
60/rpm seconds; unlike a fixed window, it never grants a second full minute at a boundary.
This is the in-process `RateLimiter`: exact for one serving process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

_PRUNE_EVERY = 10_000
_SLACK = 1e-6


class Gcra:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tat: dict[str, float] = {}  # theoretical arrival time per bucket
        self._calls = 0

    async def acquire(self, buckets: Sequence[tuple[str, int]]) -> int:
        return self.take(buckets)

    def take(self, buckets: Sequence[tuple[str, int]]) -> int:
        """Take one request from every bucket, or none; return 0, or the seconds to wait."""
        now = self._clock()
        wait = 0.0
        for name, rpm in buckets:
            interval = 60.0 / rpm
            tat = max(self._tat.get(name, now), now)
            # Allowed while the bucket's debt stays within one minute's worth of requests.
            wait = max(wait, tat + interval - now - 60.0)
        if wait > _SLACK:  # float slack: rpm * (60 / rpm) may exceed 60 by an ulp
            return max(1, math.ceil(wait - _SLACK))  # and a whole second by as much
        for name, rpm in buckets:
            self._tat[name] = max(self._tat.get(name, now), now) + 60.0 / rpm
        self._prune(now)
        return 0

    def _prune(self, now: float) -> None:
        self._calls += 1
        if self._calls % _PRUNE_EVERY == 0:
            # A bucket whose TAT is past is indistinguishable from a fresh one.
            self._tat = {k: t for k, t in self._tat.items() if t > now}
