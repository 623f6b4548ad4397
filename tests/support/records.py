"""Projects and keys written straight into a real storage, for in-process tests."""

from __future__ import annotations

from model_gateway.gateway import keys
from model_gateway.storage.base import KeyRecord, ProjectRecord, Storage, new_id, now_s


async def add_project(storage: Storage, name: str = "test", **fields) -> ProjectRecord:
    return await storage.create_project(
        ProjectRecord(id=new_id("prj"), name=name, created_at=now_s(), **fields)
    )


async def add_key(
    storage: Storage,
    pepper: bytes,
    project_id: str,
    scopes: str = "inference",
    **fields,
) -> tuple[str, KeyRecord]:
    """A new key of the project: (the full key, its stored record)."""
    secret = keys.generate_key()
    record = await storage.create_key(
        KeyRecord(
            id=new_id("key"),
            prefix=keys.public_prefix(secret),
            key_hash=keys.hash_key(pepper, secret),
            project_id=project_id,
            scopes=keys.parse_scopes(scopes),
            created_at=now_s(),
            **fields,
        )
    )
    return secret, record
