"""Fixtures of the log tests: a real SQLite storage and receipts billed through it."""

from __future__ import annotations

import hashlib
import time

import pytest

from model_gateway.gateway.metering.storage_meter import StorageMeter
from model_gateway.storage import ReceiptRecord, open_storage
from tests.support.records import add_project


@pytest.fixture
async def storage(tmp_path):
    storage = await open_storage(f"sqlite:///{tmp_path / 'gateway.db'}")
    yield storage
    await storage.close()


@pytest.fixture
async def settle(storage):
    """settle(**fields) -> the stored ReceiptRecord, billed through a real reservation."""
    return await biller(storage)


@pytest.fixture
def settle_on():
    """settle_on(storage) -> awaitable of a `settle` of that storage (any backend)."""
    return biller


async def biller(storage):
    project = await add_project(storage, "secret project name")
    await storage.add_credit(project.id, 10_000_000, "2025-01")
    meter = StorageMeter(storage)
    count = 0

    async def issue(**fields) -> ReceiptRecord:
        nonlocal count
        count += 1
        reservation = await meter.reserve(project.id, None, 1000)
        record = ReceiptRecord(
            **{
                "id": f"rcpt_{count:06d}{time.time_ns() % 10**6:06d}",
                "reservation_id": reservation.id,
                "project_id": project.id,
                "key_id": None,
                "request_id": "req_1",
                "kind": "inference",
                "endpoint": "/v1/chat/completions",
                "model_or_runtime": "echo-1",
                "status": "succeeded",
                "usage": {"input_tokens": 3, "output_tokens": 5},
                "cost": 120,
                "month": reservation.month,
                "created_at": time.time_ns() // 1000,
                "request_sha256": hashlib.sha256(b"req %d" % count).hexdigest(),
                "response_sha256": hashlib.sha256(b"resp %d" % count).hexdigest(),
                **fields,
            }
        )
        assert await storage.settle(record)
        return record

    return issue
