"""The log integrator against a real SQLite storage: receipts in, verifiable proofs out."""

from __future__ import annotations

import asyncio
import hashlib
import time

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.metering import Meter
from gateway.proofs.log import LogCorrupted, Pending, TransparencyLog, public_receipt
from gateway.proofs.merkle import verify_consistency
from gateway.proofs.receipts import canonical_bytes
from gateway.proofs.signing import SigningKey
from gateway.proofs.verify import verify_proof_document
from storage import ReceiptRecord, open_storage
from storage.base import LogLeaf, TreeHeadRecord
from tests.support.records import add_project

KEY = SigningKey(Ed25519PrivateKey.generate())


@pytest.fixture
async def storage(tmp_path):
    storage = await open_storage(f"sqlite:///{tmp_path / 'gateway.db'}")
    yield storage
    await storage.close()


@pytest.fixture
async def settle(storage):
    """settle(**fields) -> the stored ReceiptRecord, billed through a real reservation."""
    project = await add_project(storage, "secret project name")
    await storage.add_credit(project.id, 10_000_000, "2025-01")
    meter = Meter(storage)
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


def as_json(doc) -> dict:
    return msgspec.json.decode(msgspec.json.encode(doc))


async def test_public_receipt_holds_only_public_fields(settle):
    record = await settle()
    receipt = public_receipt(record)
    text = canonical_bytes(receipt).decode()
    assert receipt.cost == "0.000120"
    assert receipt.issued_at.endswith("Z")
    for private in (record.project_id, record.reservation_id, record.request_id):
        assert private not in text
    assert set(msgspec.structs.asdict(receipt)) == {
        "id",
        "issued_at",
        "kind",
        "endpoint",
        "model_or_runtime",
        "status",
        "usage",
        "cost",
        "request_sha256",
        "response_sha256",
    }


async def test_a_settled_receipt_is_pending_until_integrated_then_verifies(storage, settle):
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()  # drive integration by hand
    records = [await settle() for _ in range(3)]
    with pytest.raises(Pending):
        await log.proof(records[0].id)
    assert await log.proof("rcpt_unknown") is None
    assert await log.integrate() == 3
    assert log.size == 3
    for record in records:
        doc = await log.proof(record.id)
        result = verify_proof_document(as_json(doc), KEY.public_key)
        assert result.ok, result.reasons
        assert doc.receipt.id == record.id
    await log.stop()


async def test_the_background_task_integrates_within_a_second(storage, settle):
    log = TransparencyLog(storage, KEY)
    await log.start()
    try:
        record = await settle()
        deadline = time.monotonic() + 1
        while True:
            try:
                doc = await log.proof(record.id)
                break
            except Pending:
                assert time.monotonic() < deadline, "not integrated within a second"
                await asyncio.sleep(0.02)
        assert verify_proof_document(as_json(doc), KEY.public_key).ok
    finally:
        await log.stop()


async def test_a_restart_rebuilds_the_same_tree_and_continues_it(storage, settle):
    first = TransparencyLog(storage, KEY)
    await first.start()
    first._task.cancel()
    for _ in range(5):
        await settle()
    await first.integrate()
    old_head = await storage.tree_head()
    await first.stop()

    second = TransparencyLog(storage, KEY)
    await second.start()
    second._task.cancel()
    assert second.size == 5
    later = [await settle() for _ in range(4)]
    await second.integrate()
    new_head = await storage.tree_head()
    assert new_head.size == 9
    _, _, proof = await second.consistency(5, 9)
    assert verify_consistency(
        5, 9, bytes.fromhex(old_head.root_hash), bytes.fromhex(new_head.root_hash), proof
    )
    doc = await second.proof(later[-1].id)
    assert doc.leaf_index == 8
    assert verify_proof_document(as_json(doc), KEY.public_key).ok
    await second.stop()


async def test_a_stop_integrates_what_settled_during_shutdown(storage, settle):
    log = TransparencyLog(storage, KEY, interval_s=60)
    await log.start()
    record = await settle()
    await log.stop()
    assert await storage.log_leaf(record.id) is not None


async def test_two_integrators_on_one_database_never_fork_the_log(storage, settle):
    # Two serving processes share the database: appends race, the loser reloads.
    a, b = TransparencyLog(storage, KEY), TransparencyLog(storage, KEY)
    for log in (a, b):
        await log.start()
        log._task.cancel()
    records = [await settle() for _ in range(3)]
    await a.integrate()
    more = [await settle() for _ in range(2)]
    # b's tree is behind (size 0): it catches up from storage before appending.
    await b.integrate()
    assert b.size == 5
    for record in records + more:
        for log in (a, b):
            assert verify_proof_document(as_json(await log.proof(record.id)), KEY.public_key).ok
    leaves = await storage.log_leaves()
    assert [leaf.leaf_index for leaf in leaves] == list(range(5))


async def test_a_failed_append_leaves_the_memory_tree_as_stored(storage, settle):
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()
    await settle()
    await log.integrate()
    record = await settle()

    async def refuse(leaves, head):
        raise RuntimeError("disk full")

    original, storage.append_log = storage.append_log, refuse
    with pytest.raises(RuntimeError):
        await log.integrate()
    storage.append_log = original
    assert log.size == 1
    assert await log.integrate() == 1
    assert verify_proof_document(as_json(await log.proof(record.id)), KEY.public_key).ok


async def test_a_log_that_does_not_match_its_signed_head_refuses_to_start(storage, settle):
    record = await settle()
    receipt = public_receipt(record)
    leaf = LogLeaf(
        leaf_index=0,
        receipt_id=record.id,
        public_receipt=canonical_bytes(receipt),
        signature="00" * 64,
    )
    head = TreeHeadRecord(
        size=1,
        root_hash="00" * 32,
        timestamp="2025-01-01T00:00:00.000000Z",
        key_id="0" * 16,
        signature="00" * 64,
    )
    await storage.append_log([leaf], head)
    with pytest.raises(LogCorrupted):
        await TransparencyLog(storage, KEY).start()


async def test_a_receipt_that_cannot_be_public_is_skipped_not_blocking(storage, settle):
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()
    bad = await settle(request_sha256="not a digest")
    good = await settle()
    await log.integrate()
    assert verify_proof_document(as_json(await log.proof(good.id)), KEY.public_key).ok
    with pytest.raises(Pending):
        await log.proof(bad.id)
    await log.stop()
