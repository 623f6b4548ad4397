"""A circuit breaker per provider (decisions.md, "Routing and operations").

Closed: every request may try the provider. After `failures` consecutive failures (the
kinds a fallback is tried for) it opens: the provider is skipped, without a connection
attempt, for `cooldown_s`. Then it is half-open: one request is let through as a trial;
its success closes the breaker, its failure opens it for another cool-down. One process,
one event loop: no lock is needed, every transition happens between awaits.
"""

from __future__ import annotations

import math
import time
from collections.abc import ItemsView, Iterable
from typing import Literal

State = Literal["closed", "open", "half_open"]
GAUGE_VALUE: dict[State, int] = {"closed": 0, "open": 1, "half_open": 2}


class Breaker:
    __slots__ = ("consecutive", "cooldown_s", "failures", "opened_at", "state", "trial_out")

    def __init__(self, failures: int, cooldown_s: float) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self.state: State = "closed"
        self.consecutive = 0
        self.opened_at = 0.0
        self.trial_out = False  # half-open: the one trial request is under way

    def allow(self) -> bool:
        """Whether a request may try the provider now (a half-open trial takes the slot)."""
        if self.state == "closed":
            return True
        if self.state == "open":
            if time.monotonic() - self.opened_at < self.cooldown_s:
                return False
            self.state = "half_open"
        if self.trial_out:
            return False
        self.trial_out = True
        return True

    def success(self) -> None:
        self.state, self.consecutive, self.trial_out = "closed", 0, False

    def failure(self) -> None:
        self.consecutive += 1
        if self.state == "half_open" or self.consecutive >= self.failures:
            self.state, self.opened_at, self.trial_out = "open", time.monotonic(), False

    def abandoned(self) -> None:
        """The attempt ended without a verdict (the client left): free the trial slot."""
        self.trial_out = False

    def retry_after_s(self) -> int:
        """Whole seconds until the provider may be tried again (at least 1)."""
        if self.state != "open":
            return 1  # half-open with its trial under way: soon decided
        left = self.opened_at + self.cooldown_s - time.monotonic()
        return max(1, math.ceil(left))


class Breakers:
    """Every provider's breaker, by provider name."""

    def __init__(self, names: Iterable[str], failures: int, cooldown_s: float) -> None:
        self._by_name = {name: Breaker(failures, cooldown_s) for name in names}

    def __getitem__(self, name: str) -> Breaker:
        return self._by_name[name]

    def items(self) -> ItemsView[str, Breaker]:
        return self._by_name.items()

    def states(self) -> dict[str, State]:
        """Each provider's state as a reader sees it now (an elapsed cool-down is half-open)."""
        now = time.monotonic()
        return {
            name: "half_open"
            if b.state == "open" and now - b.opened_at >= b.cooldown_s
            else b.state
            for name, b in self._by_name.items()
        }
