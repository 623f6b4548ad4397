"""The admin epoch, the instance registry (ClusterPort) and the shared rate-limit buckets
(RateLimitPort: migration 0018) on PostgreSQL.

Rate limits: the moves (takes and give-backs) that concurrent requests ask for in one loop
turn go as one statement (migration 0020, storage/batching.py), each item decided as it
would be alone after the items before it; a batch that fails runs its items alone.

Admin epoch: every process LISTENs on the `gateway_admin` channel on a connection of its
own. Triggers on `projects` and `api_keys` NOTIFY it at the commit of any change, by any
writer; the notification bumps an in-process counter, so `admin_epoch()` never touches
the database. A change made through a handle of this process bumps every handle of the
process on the same database at once; other processes see it when the notification
arrives (normally well under a millisecond later). While the listening connection is down
the epoch is different on every call, so the key cache never serves a stale entry.

Instances (migration 0009): every key or project change also takes the next admin change
number (one counter row, so numbers commit in order) and notifies it as the payload; the
handle counts the newest it heard (`admin_applied`). An instance's lease renewal reads
the counter FOR SHARE after renewing, in one transaction, so a change that commits
meanwhile is either read by the renewal or finds the instance live (gateway/cluster/instance.py
and gateway/cluster/admin_confirm.py use this). Leases are on the database's clock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Hashable

import asyncpg  # type: ignore[import-untyped]  # ships no type information

from model_gateway.storage.batching import Outcome
from model_gateway.storage.postgres.connection import (
    Connection,
    PostgresBase,
    RateMove,
    Row,
    _failure,
    batch_or_each,
)
from model_gateway.storage.postgres.rows import _fields
from model_gateway.storage.rate_limit_port import RateLimitPort
from model_gateway.storage.records import InstanceRecord

# The backend's one logger, as before its split into modules: model_gateway.storage.postgres.
log = logging.getLogger(__package__)

CHANNEL = "gateway_admin"
_LATEST_CHANGE = "SELECT n FROM admin_changes"
_LISTENER_PING_S = 2.0
_RECONNECT_S = 1.0
_DEAF = itertools.count()  # epochs handed out while not listening: never the same twice


def _instance(row: Row) -> InstanceRecord:
    return InstanceRecord(**_fields(row, InstanceRecord))


class PostgresCluster(PostgresBase, RateLimitPort):
    """The admin epoch (LISTEN/NOTIFY), the instances and the rate-limit buckets."""

    async def _listen(self) -> None:
        conn = await asyncpg.connect(
            self._dsn, server_settings={"application_name": "model-gateway-listener"}
        )
        try:
            await conn.add_listener(CHANNEL, self._on_notify)
            # Read after listening: a later change is heard, an earlier one is counted here.
            latest = await conn.fetchval(_LATEST_CHANGE)
        except BaseException:
            await conn.close()
            raise
        conn.add_termination_listener(self._on_listener_lost)
        self._listener = conn
        # Whatever changed while we were not listening is unknown: drop every cache.
        self._epoch += 1
        self._admin_applied = max(self._admin_applied, latest)

    def _on_notify(self, conn: Connection, pid: int, channel: str, payload: str) -> None:
        self._epoch += 1
        if payload.isdigit():  # the change number (migration 0009)
            self._admin_applied = max(self._admin_applied, int(payload))
        for callback in self._watchers:
            callback(self._admin_applied)

    def watch_admin(self, callback: Callable[[int], None]) -> None:
        self._watchers.append(callback)

    def catch_up_admin(self, change: int) -> None:
        if change > self._admin_applied:
            self._epoch += 1  # a change we were not told of: drop every cache
            self._admin_applied = change

    def _on_listener_lost(self, conn: Connection) -> None:
        if conn is self._listener:
            self._listener = None
            self._reconnect_soon()

    def _reconnect_soon(self) -> None:
        if self._closed or self._reconnecting is not None:
            return
        self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        try:
            while not self._closed and self._listener is None:
                failure = await _failure(self._listen)
                if failure is not None:
                    log.warning("admin notifications: cannot listen (%s); retrying", failure)
                    await asyncio.sleep(_RECONNECT_S)
        finally:
            self._reconnecting = None

    def admin_epoch(self) -> Hashable:
        if self._listener is None:
            return ("deaf", next(_DEAF))  # cannot hear other processes: never cache
        return self._epoch

    async def _check_listener(self) -> None:
        """A dead connection is noticed only when used: reconnect the listener if it does
        not answer."""
        listener = self._listener
        if listener is None:
            self._reconnect_soon()
            return
        failure = await _failure(
            lambda: asyncio.wait_for(listener.fetchval("SELECT 1"), _LISTENER_PING_S)
        )
        if failure is not None:
            log.warning("admin notifications: listener lost (%s); reconnecting", failure)
            listener.terminate()
            if self._listener is listener:
                self._listener = None
            self._reconnect_soon()

    # --- instances ---------------------------------------------------------------------

    async def admin_change(self) -> int:
        return int(await self._run(lambda c: c.fetchval(_LATEST_CHANGE)))

    async def renew_instance(self, instance_id: str, lease_ms: int, acked: int) -> int:
        async def renew(conn: Connection) -> int:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO instances (id, started_at, lease_until, acked)"
                    " VALUES ($1, gateway_now_ms(), gateway_now_ms() + $2, $3)"
                    " ON CONFLICT (id) DO UPDATE SET lease_until = excluded.lease_until,"
                    " acked = greatest(instances.acked, excluded.acked)",
                    instance_id,
                    lease_ms,
                    acked,
                )
                # After the renewal, and locked against a change committing meanwhile
                # (migration 0009 says why).
                return int(await conn.fetchval(_LATEST_CHANGE + " FOR SHARE"))

        return await self._run(renew)

    async def acknowledge_admin(self, instance_id: str, change: int) -> None:
        await self._run(
            lambda c: c.execute(
                "UPDATE instances SET acked = $2 WHERE id = $1 AND acked < $2",
                instance_id,
                change,
            )
        )

    async def deregister_instance(self, instance_id: str) -> None:
        await self._run(lambda c: c.execute("DELETE FROM instances WHERE id = $1", instance_id))

    async def list_instances(self) -> list[InstanceRecord]:
        return await self._all(
            _instance,
            "SELECT id, started_at, lease_until, acked,"
            " lease_until >= gateway_now_ms() AS live FROM instances ORDER BY id",
        )

    async def forget_instances(self, expired_for_ms: int) -> int:
        status = await self._run(
            lambda c: c.execute(
                "DELETE FROM instances WHERE lease_until < gateway_now_ms() - $1", expired_for_ms
            )
        )
        return int(status.rsplit(" ", 1)[1])

    # --- rate limits, shared by every instance (migrations 0018, 0020) ----------------

    async def _move_rate_limits(
        self, buckets: list[tuple[str, int, int]], forced: bool, at_us: int | None
    ) -> tuple[int, int]:
        """The concurrent requests' moves go as one statement per batch (migration 0020),
        each decided as alone."""
        return await self._rate_moves.submit(RateMove(buckets, forced, at_us))

    async def _rate_move_batch(self, batch: list[RateMove]) -> list[Outcome[tuple[int, int]]]:
        async def together() -> list[Outcome[tuple[int, int]]]:
            row = await self._run(
                lambda c: c.fetchrow(
                    "SELECT waits, refused FROM rate_limit_move_many($1, $2, $3, $4, $5, $6)",
                    [len(move.buckets) for move in batch],
                    [name for move in batch for name, _, _ in move.buckets],
                    [limit for move in batch for _, limit, _ in move.buckets],
                    [units for move in batch for _, _, units in move.buckets],
                    [move.forced for move in batch],
                    [move.at_us for move in batch],
                )
            )
            return list(zip(row["waits"], row["refused"], strict=True))

        return await batch_or_each(together, self._rate_move_one, batch)

    async def _rate_move_one(self, move: RateMove) -> tuple[int, int]:
        row = await self._run(
            lambda c: c.fetchrow(
                "SELECT wait, refused FROM rate_limit_move($1, $2, $3, $4, $5::BIGINT)",
                [name for name, _, _ in move.buckets],
                [limit for _, limit, _ in move.buckets],
                [units for _, _, units in move.buckets],
                move.forced,
                move.at_us,
            )
        )
        return int(row["wait"]), int(row["refused"])

    async def take_rate_limits(
        self, buckets: list[tuple[str, int, int]], at_us: int | None = None
    ) -> tuple[int, int]:
        """Take the units from every (name, per minute, units) bucket or from none, in one
        statement on the database's clock (`at_us`: a given time instead, for tests): (0,
        -1), or (the whole seconds to wait, the index of the bucket that waits longest)."""
        return await self._move_rate_limits(buckets, False, at_us)

    async def give_back_rate_limits(
        self, buckets: list[tuple[str, int, int]], at_us: int | None = None
    ) -> None:
        """Give the units back to every bucket (negative units: take them), in one
        statement."""
        back = [(name, limit, -count) for name, limit, count in buckets]
        await self._move_rate_limits(back, True, at_us)

    async def prune_rate_limits(self) -> int:
        """Delete buckets that are full again (the same as no row); rows a request holds
        are skipped, never waited for. Returns how many went."""
        status = await self._run(
            lambda c: c.execute(
                "DELETE FROM rate_buckets WHERE bucket IN (SELECT bucket FROM rate_buckets"
                " WHERE empty_at_ms < floor(extract(epoch FROM clock_timestamp()) * 1000)"
                " FOR UPDATE SKIP LOCKED)"
            )
        )
        return int(status.split()[-1])
