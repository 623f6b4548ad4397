"""Reservations and settlements against storage, and the leases that keep none forever.

Every reservation is owned by the serving process (`host:pid:start-time`) and leased. The
process renews its leases while it runs; at start-up and then periodically it releases
reservations whose lease expired or whose owner process on this host is gone (kill -9),
so nothing stays reserved and nothing is charged twice (a receipt consumes its hold once).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from datetime import UTC, datetime

import anyio

from gateway.errors import BudgetExceeded, InsufficientBalance
from storage import LimitReached, ReceiptRecord, ReservationRecord, Storage

log = logging.getLogger("gateway.metering")

LEASE_S = 600  # longer than any request may run (gateway timeout 120 s, sandbox limits)
SWEEP_EVERY_S = 30
CHECKPOINT_EVERY_S = 1  # the request path's writer never checkpoints (it would fsync)


def current_month() -> str:
    return datetime.now(UTC).strftime("%Y-%m")


def _start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # Field 22 (start time) follows the parenthesised command name.
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_owner() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid)}"


def owner_alive(owner: str) -> bool | None:
    """True or False for an owner on this host; None for another host's (its lease decides)."""
    host, pid, ticks = owner.rsplit(":", 2)
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return _start_ticks(int(pid)) == ticks


class Meter:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.owner = process_owner()
        self._sweeper: asyncio.Task | None = None

    async def start(self) -> None:
        released = await self.storage.release_abandoned(owner_alive)
        if released:
            log.warning("released %d reservation(s) abandoned by a dead process", released)
        self._sweeper = asyncio.create_task(self._sweep_forever())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(self._sweeper, return_exceptions=True)

    async def _sweep_forever(self) -> None:
        last_sweep = time.monotonic()
        while True:
            await asyncio.sleep(CHECKPOINT_EVERY_S)
            try:
                await self.storage.checkpoint()
                if time.monotonic() - last_sweep >= SWEEP_EVERY_S:
                    last_sweep = time.monotonic()
                    await self.storage.renew_leases(self.owner, int(time.time()) + LEASE_S)
                    await self.storage.release_abandoned(owner_alive)
            except Exception:
                log.exception("storage housekeeping failed; retrying")

    async def reserve(self, project_id: str, key_id: str | None, amount: int) -> ReservationRecord:
        now = int(time.time())
        reservation = ReservationRecord(
            id="rsv_" + secrets.token_hex(12),
            project_id=project_id,
            key_id=key_id,
            amount=amount,
            month=current_month(),
            owner=self.owner,
            lease_until=now + LEASE_S,
            created_at=now,
        )
        try:
            await self.storage.reserve(reservation)
        except LimitReached as refused:
            if refused.reason == "budget_exceeded":
                raise BudgetExceeded() from None
            raise InsufficientBalance() from None
        return reservation

    async def settle(self, receipt: ReceiptRecord) -> bool:
        settled = await self.storage.settle(receipt)
        if not settled:
            log.error("reservation %s was gone at settlement; not charged", receipt.reservation_id)
        return settled

    async def release(self, reservation: ReservationRecord) -> None:
        await self.storage.release(reservation.id)
