"""This process as one instance of the deployment: leased, acknowledging, self-fencing.

The instance registers in storage under its owner string (`host:pid:start-time`, the
owner of its holds and runs) with a lease of `[cluster] lease_s` on the database's clock,
and renews it every third of that. Each renewal returns the newest admin change number;
the storage handle applies it (drops its caches if it had not heard of it) before the
instance serves on, and the instance acknowledges it. Changes heard between renewals (a
PostgreSQL notification) are acknowledged at once, after the handle moved its epoch.

Self-fencing: the lease the others see ends `lease_s` after the database started the
renewal, so this process stops serving keyed and metered requests `lease_s` after it
*sent* its last successful renewal (503 service_unavailable). The others may then call
it dead (release its holds, fail its runs, stop waiting for it), and it is: it serves
nothing until a renewal succeeds, and that renewal catches its caches up first. The
check on the request path is one clock read and a comparison.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import anyio

from model_gateway.gateway.cluster.background import stop_tasks
from model_gateway.pipeline.errors import ServiceUnavailable
from model_gateway.storage import ClusterPort

log = logging.getLogger("gateway.instance")

# A dead instance's row is kept this long for operators (and the sweeps: its owner string
# marks its holds and runs dead), then dropped.
FORGET_AFTER_MS = 3_600_000


class Instance:
    def __init__(self, storage: ClusterPort, instance_id: str, lease_s: float) -> None:
        self.storage = storage
        self.id = instance_id
        self.lease_s = lease_s
        self._serving_until = 0.0  # monotonic; fenced until the first renewal
        self._acked = 0  # the newest change written as acknowledged
        self._heard = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Register (a failure stops the start-up), then renew and acknowledge forever."""
        await self._renew()
        self.storage.watch_admin(lambda _change: self._heard.set())
        self._tasks = [
            asyncio.create_task(self._renew_forever()),
            asyncio.create_task(self._acknowledge_forever()),
        ]

    async def stop(self) -> None:
        with anyio.CancelScope(shield=True):
            await stop_tasks(*self._tasks)
            try:
                await self.storage.deregister_instance(self.id)
            except Exception:
                log.exception("could not deregister; the lease will end on its own")

    def serving(self) -> bool:
        return time.monotonic() < self._serving_until

    def check_serving(self) -> None:
        """Raise the spec's 503 while fenced (no I/O)."""
        if time.monotonic() >= self._serving_until:
            raise ServiceUnavailable(
                "This gateway instance lost its lease on the database; try again shortly.",
                retry_after=max(1, math.ceil(self.lease_s / 3)),
            )

    async def _renew(self) -> None:
        sent, applied = time.monotonic(), self.storage.admin_applied()
        latest = await asyncio.wait_for(
            self.storage.renew_instance(self.id, round(self.lease_s * 1000), applied),
            self.lease_s,
        )
        self._acked = max(self._acked, applied)
        self.storage.catch_up_admin(latest)  # caches drop before we serve on
        was_fenced = not self.serving()
        self._serving_until = sent + self.lease_s
        if was_fenced and self._tasks:
            log.warning("lease renewed: serving again")
        if latest > self._acked:
            self._heard.set()

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self._renew()
                await self.storage.forget_instances(FORGET_AFTER_MS)
            except Exception as exc:
                # Stay up: a later renewal may succeed; meanwhile the lease runs out.
                log.warning("lease renewal failed (%s); fenced if it keeps failing", exc)

    async def _acknowledge_forever(self) -> None:
        while True:
            await self._heard.wait()
            self._heard.clear()
            change = self.storage.admin_applied()  # applied already: the epoch moved
            if change <= self._acked:
                continue
            try:
                await self.storage.acknowledge_admin(self.id, change)
                self._acked = change
            except Exception as exc:
                # The next renewal carries it (its `acked`).
                log.warning("could not acknowledge admin change %d (%s)", change, exc)
