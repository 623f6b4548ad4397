"""Sign-in throttle: after N failures for one email, or M from one client address, within
the window, sign-in answers 429 with retry-after until the oldest counted failure leaves it.

Failures are rows in the database, so the count survives a restart and holds for every
process that shares the database. Within a process, sign-ins of one email or one address
take turns (`turn`): the count is checked, the password verified and a failure recorded
before the next one starts, so that concurrent guesses cannot all pass the check while the
password hash runs. Across several instances, a burst can still reach each one's check at
once: at most `limit + instances - 1` failures then. A failure is written with its
`session.sign_in_failed` audit entry (the email tried, never the password).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from model_gateway.gateway.admin.admin_context import ANONYMOUS
from model_gateway.gateway.admin.audit_trail import entry
from model_gateway.gateway.config import ConsoleConfig
from model_gateway.pipeline.errors import RateLimitExceeded
from model_gateway.storage import ConsolePort
from model_gateway.storage.base import now_s


def subjects(email: str, address: str) -> tuple[str, str]:
    return f"email:{email.strip().lower()}", f"addr:{address}"


class LoginThrottle:
    def __init__(self, storage: ConsolePort, config: ConsoleConfig) -> None:
        self.storage = storage
        self.window_s = config.login_window_s
        self.limits = (config.login_failures_per_email, config.login_failures_per_address)
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # subject -> lock, users

    @contextlib.asynccontextmanager
    async def turn(self, email: str, address: str) -> AsyncIterator[None]:
        """One sign-in at a time per email and per address (the email's lock first, always:
        two sign-ins never wait for each other in a cycle)."""
        async with contextlib.AsyncExitStack() as stack:
            for subject in subjects(email, address):
                await stack.enter_async_context(self._turn_of(subject))
            yield

    @contextlib.asynccontextmanager
    async def _turn_of(self, subject: str) -> AsyncIterator[None]:
        lock, users = self._turns.get(subject) or (asyncio.Lock(), 0)
        self._turns[subject] = lock, users + 1
        try:
            async with lock:
                yield
        finally:
            lock, users = self._turns[subject]
            if users == 1:
                del self._turns[subject]  # memory stays flat however many subjects come
            else:
                self._turns[subject] = lock, users - 1

    async def check(self, email: str, address: str) -> None:
        """Raise 429 while either subject has used up its failures in the window."""
        now = now_s()
        waits = []
        for subject, limit in zip(subjects(email, address), self.limits, strict=True):
            failures = await self.storage.login_failures(subject, now - self.window_s)
            if len(failures) >= limit:
                # Allowed again once enough of them have left the window (timestamps are
                # whole seconds and the window's start is inclusive: hence the + 1).
                waits.append(failures[len(failures) - limit] + self.window_s + 1 - now)
        if waits:
            wait = max(1, max(waits))
            raise RateLimitExceeded("Too many failed sign-ins. Try again later.", retry_after=wait)

    async def failed(self, email: str, address: str) -> None:
        about = {"type": "user", "email": email.strip()}
        audit = entry(ANONYMOUS, "session.sign_in_failed", about)
        await self.storage.record_login_failure(list(subjects(email, address)), now_s(), audit)

    async def succeeded(self, email: str) -> None:
        await self.storage.clear_login_failures(subjects(email, "")[0])
