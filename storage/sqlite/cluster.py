"""The admin epoch and the instance registry (ClusterPort) on SQLite."""

from __future__ import annotations

import time
from typing import ClassVar

from model_gateway.storage.records import InstanceRecord
from model_gateway.storage.sqlite.connection import SQLiteBase


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class SQLiteCluster(SQLiteBase):
    """The admin epoch (a file) and the instances."""

    def admin_epoch(self) -> tuple[int, int]:
        return self._epoch.current()

    # Instances: the registry leases the one serving process (and fences it); nothing waits
    # for acknowledgements, since every change is seen at the next request (the epoch file).
    instances_acknowledge_changes: ClassVar[bool] = False

    async def admin_change(self) -> int:
        row = await self._fetchone("SELECT n FROM admin_changes")
        return 0 if row is None else int(row["n"])

    async def renew_instance(self, instance_id: str, lease_ms: int, acked: int) -> int:
        now = _now_ms()
        await self._write(
            "INSERT INTO instances (id, started_at, lease_until, acked) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET lease_until = excluded.lease_until,"
            " acked = max(acked, excluded.acked)",
            (instance_id, now, now + lease_ms, acked),
        )
        return await self.admin_change()

    async def acknowledge_admin(self, instance_id: str, change: int) -> None:
        await self._write(
            "UPDATE instances SET acked = ? WHERE id = ? AND acked < ?",
            (change, instance_id, change),
        )

    async def deregister_instance(self, instance_id: str) -> None:
        await self._write("DELETE FROM instances WHERE id = ?", (instance_id,))

    async def list_instances(self) -> list[InstanceRecord]:
        rows = await self._fetchall(
            "SELECT id, started_at, lease_until, acked, lease_until >= ? AS live"
            " FROM instances ORDER BY id",
            (_now_ms(),),
        )
        return [InstanceRecord(**{**dict(row), "live": bool(row["live"])}) for row in rows]

    async def forget_instances(self, expired_for_ms: int) -> int:
        return await self._write(
            "DELETE FROM instances WHERE lease_until < ?", (_now_ms() - expired_for_ms,)
        )
