"""The pipeline's `Meter` over storage: reservations, settlements, and the leases that keep
no hold forever.

Every reservation is owned by the serving process (`host:pid:start-time`) and leased for
`[cluster] lease_s`. The process renews its leases every third of that; at start-up and
at each renewal it releases reservations whose lease expired, whose owner process on this
host is gone (kill -9), or whose owner instance's lease in the registry ended (another
host's dead instance: gateway/cluster/instance.py), so nothing stays reserved and nothing is
charged twice (a receipt consumes its hold once). A fenced instance takes no new hold.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from model_gateway.gateway.cluster.background import stop_tasks
from model_gateway.gateway.cluster.instance import Instance
from model_gateway.gateway.config import ClusterConfig
from model_gateway.gateway.metering.refusals import explain
from model_gateway.gateway.ops.metrics import Metrics
from model_gateway.gateway.proofs.commitments import (
    new_salts,
    request_commitment,
    response_commitment,
)
from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.ports import Reserved
from model_gateway.storage import LimitReached, ReceiptRecord, ReservationRecord, Storage

log = logging.getLogger("gateway.metering")

CHECKPOINT_EVERY_S = 1  # the request path's writer never checkpoints (it would fsync)


_month = ("", 0.0)  # the current UTC month and the time.time() it ends at


def current_month() -> str:
    """The UTC month, "YYYY-MM": formatted once a month (its end is known), not per hold."""
    global _month
    if (seconds := time.time()) >= _month[1]:
        now = datetime.fromtimestamp(seconds, UTC)
        following = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)
        _month = (now.strftime("%Y-%m"), following.timestamp())
    return _month[0]


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


async def owner_check(storage: Storage) -> Callable[[str], bool | None]:
    """`owner_alive`, plus the registry: an owner whose instance lease ended is dead, on
    any host. An owner the registry does not know (gone, or older than it) is judged by
    its process on this host, else by its own lease."""
    ended = {i.id for i in await storage.list_instances() if not i.live}

    def alive(owner: str) -> bool | None:
        return False if owner in ended else owner_alive(owner)

    return alive


class StorageMeter:
    def __init__(
        self,
        storage: Storage,
        metrics: Metrics | None = None,
        *,
        owner: str | None = None,
        lease_s: float = ClusterConfig().lease_s,
        instance: Instance | None = None,
        on_settling: Callable[[ReceiptRecord], None] | None = None,
    ) -> None:
        self.storage = storage
        self.metrics = metrics
        self.owner = owner or process_owner()
        self.lease_s = lease_s
        self.instance = instance  # None: never fenced (embedded without a registry)
        self.on_settling = on_settling  # each receipt as it is stored (the log: no read-back)
        self.open_holds = 0  # this process's holds not yet settled or released
        self._sweeper: asyncio.Task[None] | None = None
        # Holds whose release failed (storage locked, gone): retried by the sweeper, so a
        # failure never leaves money held while this process keeps renewing its leases.
        self._unreleased: set[str] = set()

    async def start(self) -> None:
        await self._release_abandoned()
        self._sweeper = asyncio.create_task(self._sweep_forever())

    async def _release_abandoned(self) -> None:
        released = await self.storage.release_abandoned(await owner_check(self.storage))
        if released:
            log.warning("released %d reservation(s) abandoned by a dead process", released)

    async def stop(self) -> None:
        await stop_tasks(self._sweeper)  # waits for it even when this caller is cancelled

    async def _sweep_forever(self) -> None:
        renew_every = self.lease_s / 3
        last_renewal = last_checkpoint = time.monotonic()
        while True:
            await asyncio.sleep(min(CHECKPOINT_EVERY_S, renew_every))
            try:
                if time.monotonic() - last_checkpoint >= CHECKPOINT_EVERY_S:
                    last_checkpoint = time.monotonic()
                    await self.storage.checkpoint()
                # Renewals first: however many releases wait for a retry (an outage's
                # worth), this process's live holds and leases never expire behind them.
                if time.monotonic() - last_renewal >= renew_every:
                    last_renewal = time.monotonic()
                    await self.storage.renew_leases(self.owner, self._lease_until())
                    await self._release_abandoned()
                await self._retry_releases()
            except Exception:
                log.exception("storage housekeeping failed; retrying")

    def _lease_until(self) -> int:
        return math.ceil(time.time() + self.lease_s)

    async def reserve(
        self, project_id: str, key_id: str | None, amount: int, *, watched: bool = False
    ) -> Reserved:
        """A written hold, shown in `reserved` once committed, watched or not."""
        if self.instance is not None:
            self.instance.check_serving()
        month = current_month()
        try:
            return await self._hold(project_id, key_id, amount, month)
        except LimitReached as refused:
            if self.metrics is not None:
                self.metrics.reservation_refused(refused.reason)
            raise await explain(
                self.storage, refused.reason, project_id, key_id, amount, month
            ) from None

    async def _hold(
        self, project_id: str, key_id: str | None, amount: int, month: str
    ) -> ReservationRecord:
        """The atomic hold; LimitReached, uncounted and unexplained, when refused."""
        reservation = self._hold_record(project_id, key_id, amount, month)
        await self._write_hold(reservation, self.storage.reserve)
        self.open_holds += 1
        return reservation

    async def _write_hold(
        self, record: ReservationRecord, write: Callable[[ReservationRecord], Awaitable[None]]
    ) -> None:
        """Write a hold or a lease. One whose write fails otherwise than by a refusal may
        have committed (PostgreSQL: the connection lost after COMMIT) with nobody to
        release it: the sweeper deletes it (nothing, if it never was), so that this
        process does not renew it forever."""
        try:
            await write(record)
        except LimitReached:
            raise
        except BaseException:
            self._unreleased.add(record.id)
            raise

    def _hold_record(
        self, project_id: str, key_id: str | None, amount: int, month: str
    ) -> ReservationRecord:
        """A new hold (or lease) of this process, leased to it like its others."""
        return ReservationRecord(
            # The form of a hold's id, stored in 12 bytes by a receipt (migration 0011).
            id="rsv_" + secrets.token_hex(12),
            project_id=project_id,
            key_id=key_id,
            amount=amount,
            month=month,
            owner=self.owner,
            lease_until=self._lease_until(),
            created_at=int(time.time()),
        )

    async def settle(self, reservation: Reserved, settlement: Settlement) -> None:
        assert isinstance(reservation, ReservationRecord)
        if not await self._charge(receipt_record(reservation, settlement)):
            log.error("reservation %s was gone at settlement; not charged", reservation.id)
        self.open_holds -= 1
        if self.metrics is not None:
            self.metrics.charged(settlement)

    async def _charge(self, receipt: ReceiptRecord) -> bool:
        """Store the receipt, charging its hold; False when the hold was gone. The log hears
        of it first: its reads run on the loop, and one may come between the commit and
        this coroutine's next step, which would find the receipt committed and not offered
        (and read it back whole). An offer is only a hint (what the log takes is what
        storage lists), so one whose settlement fails is never logged."""
        if self.on_settling is not None:
            self.on_settling(receipt)
        return await self.storage.settle(receipt)

    async def release(self, reservation: Reserved) -> None:
        self.open_holds -= 1
        try:
            await self.storage.release(reservation.id)
        except Exception:
            self._unreleased.add(reservation.id)
            raise

    async def _retry_releases(self) -> None:
        for reservation_id in list(self._unreleased):
            await self.storage.release(reservation_id)
            self._unreleased.discard(reservation_id)


def receipt_record(reservation: ReservationRecord, settlement: Settlement) -> ReceiptRecord:
    response_sha256 = settlement.response_sha256 or _EMPTY_SHA256
    request_salt, response_salt = new_salts()
    return ReceiptRecord(
        id=settlement.receipt_id,
        reservation_id=reservation.id,
        project_id=reservation.project_id,
        key_id=reservation.key_id,
        request_id=settlement.request_id,
        kind=settlement.kind,
        endpoint=settlement.endpoint,
        model_or_runtime=settlement.subject,
        status=settlement.status,
        usage=settlement.usage,
        cost=settlement.cost,
        month=reservation.month,
        created_at=time.time_ns() // 1000,
        request_sha256=hashlib.sha256(settlement.request_body).hexdigest(),
        response_sha256=response_sha256,
        # Fresh salts per receipt: the public commitments reveal nothing about short bodies.
        request_salt=request_salt.hex(),
        response_salt=response_salt.hex(),
        request_commitment=request_commitment(request_salt, settlement.request_body),
        response_commitment=response_commitment(response_salt, response_sha256),
        usage_source=settlement.usage_source,
        provider=settlement.provider,
    )


_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
