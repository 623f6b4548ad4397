"""After a revocation or an archive: wait until every live instance dropped it from its caches.

The change has committed; it has an admin change number (storage counts every key and
project change). Each instance writes the newest number its caches reflect into its
registry row (gateway/cluster/instance.py), at once when notified, else at its next renewal. This
polls the registry until every instance holding a lease has acknowledged the number, so
the very next request is refused everywhere. An instance that does not acknowledge
before its lease ends is dead: it serves nothing until it renews, and it catches up
before serving again. The wait is bounded: one lease and a half.
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from model_gateway.storage import Storage

POLL_S = 0.005
#: The exit code of an admin command whose change an instance still holding its lease had
#: not confirmed when the wait ended (the change itself is committed).
UNCONFIRMED_EXIT = 3


class Confirmation(msgspec.Struct, kw_only=True):
    change: int  # the admin change number waited for
    confirmed: list[str]  # live instances that dropped it
    dead: list[str]  # instances whose lease ended (or that left) without confirming
    unconfirmed: list[str]  # still holding a lease, not confirmed, when the wait ended
    waited_ms: int

    def view(self) -> dict[str, object]:
        return {
            "confirmed": self.confirmed,
            "dead": self.dead,
            "unconfirmed": self.unconfirmed,
            "waited_ms": self.waited_ms,
        }


async def confirm_admin_change(storage: Storage, lease_s: float) -> Confirmation:
    """Wait (at most 1.5 leases) until every live instance acknowledged the newest change."""
    started = time.monotonic()
    change = await storage.admin_change()
    deadline = started + lease_s * 1.5
    watched: set[str] = set()  # seen live without its acknowledgement
    while True:
        instances = await storage.list_instances()
        pending = {i.id for i in instances if i.live and i.acked < change}
        if not storage.instances_acknowledge_changes:
            pending = set()  # every process sees the change at its next request
        watched |= pending
        if pending and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            continue
        live = {i.id for i in instances if i.live}
        return Confirmation(
            change=change,
            confirmed=sorted(live - pending),
            dead=sorted(watched - live),
            unconfirmed=sorted(pending),
            waited_ms=round((time.monotonic() - started) * 1000),
        )
