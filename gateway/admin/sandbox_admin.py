"""Sandbox configurations of a project."""

from __future__ import annotations

from model_gateway.gateway.admin.admin_context import AdminContext, InvalidChange
from model_gateway.gateway.sandbox.limits import SANDBOX_LIMITS
from model_gateway.storage.base import SandboxRecord, new_id, now_s


async def create_sandbox(
    admin: AdminContext, project_id: str, *, runtime: str, timeout_s: int, memory_mb: int
) -> SandboxRecord:
    """A sandbox configuration (RecordNotFound); limits outside SANDBOX_LIMITS are refused
    (InvalidChange naming the field)."""
    for name, value in (("timeout_s", timeout_s), ("memory_mb", memory_mb)):
        limit = SANDBOX_LIMITS[name]
        if not limit.low <= value <= limit.high:
            raise InvalidChange(f"must be between {limit.low} and {limit.high}", name)
    sandbox = SandboxRecord(
        id=new_id("sbx"),
        project_id=project_id,
        runtime=runtime,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        created_at=now_s(),
    )
    return await admin.storage.create_sandbox(sandbox)
