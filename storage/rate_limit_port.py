"""A port that only a backend shared by instances offers: rate-limit buckets in the
database (PostgreSQL). Not part of `Storage` (storage/ports.py)."""

from __future__ import annotations

import abc
from typing import Protocol


class RateLimitPort(Protocol):
    """Rate-limit buckets shared by every instance (PostgreSQL only, migration 0018; not
    part of `Storage`: gateway/ratelimit/limiters.py asks for it by name
    (_shares_rate_limits)). Weighted GCRA, the rule of pipeline/gcra.py; buckets are
    (name, units per minute, units) as `pipeline.ports.Take`."""

    @abc.abstractmethod
    async def take_rate_limits(
        self, buckets: list[tuple[str, int, int]], at_us: int | None = None
    ) -> tuple[int, int]:
        """Take the units from every bucket or from none, in one statement on the
        database's clock (`at_us`: a given time instead, for tests): (0, -1), or (the whole
        seconds to wait, the index of the bucket that waits longest)."""

    @abc.abstractmethod
    async def give_back_rate_limits(
        self, buckets: list[tuple[str, int, int]], at_us: int | None = None
    ) -> None:
        """Give the units back to every bucket (never beyond full; negative units are
        taken whatever the bucket holds), in one statement."""

    @abc.abstractmethod
    async def prune_rate_limits(self) -> int:
        """Delete buckets that are full again (the same as no row); rows a request
        holds are skipped, never waited for. Returns how many went."""
