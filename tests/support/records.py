"""Projects, keys and receipts written straight into a real storage, for in-process tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from model_gateway.gateway.access import keys
from model_gateway.gateway.metering.storage_meter import StorageMeter
from model_gateway.pipeline.context import Settlement
from model_gateway.storage.base import (
    KeyRecord,
    ProjectRecord,
    ReceiptRecord,
    Storage,
    new_id,
    now_s,
)


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


async def offering_meter(storage, offer: Callable[[ReceiptRecord], None]):
    """charge() -> the id of a receipt settled by a real meter that hands it to `offer`
    as it stores it (a log's, or the log process's)."""
    project = await add_project(storage, "offering")
    await storage.add_credit(project.id, 10_000_000, "2025-01")
    meter = StorageMeter(storage, on_settling=offer)
    count = 0

    async def charge() -> str:
        nonlocal count
        count += 1
        hold = await meter.reserve(project.id, None, 1000)
        settlement = Settlement(
            receipt_id=f"rcpt_{count:04x}{time.time_ns():x}",
            request_id=f"req_{count:04x}",
            kind="inference",
            endpoint="/v1/chat/completions",
            subject="echo-1",
            status="succeeded",
            usage={"input_tokens": 3, "output_tokens": count},
            cost=100 + count,
            request_body=b'{"n": %d}' % count,
            response_sha256=None,
        )
        await meter.settle(hold, settlement)
        return settlement.receipt_id

    return charge
