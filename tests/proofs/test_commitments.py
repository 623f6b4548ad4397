"""Salted commitments (public receipt v2) from settlement to log, on a real SQLite storage:
the meter's receipt record, its storage round trip, the leaf and its proof; receipts
issued before commitments, and a database written by the version 1 code."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import msgspec
import pytest

from model_gateway.gateway.api import receipt_view
from model_gateway.gateway.metering.storage_meter import StorageMeter, receipt_record
from model_gateway.gateway.proofs.log import TransparencyLog, public_receipt
from model_gateway.gateway.proofs.log_key import SigningKey
from model_gateway.gateway.proofs.merkle import verify_consistency
from model_gateway.gateway.proofs.receipts import PublicReceipt, PublicReceiptV1
from model_gateway.gateway.proofs.verify import verify_proof_document
from model_gateway.pipeline.context import Settlement
from model_gateway.storage import open_storage
from tests.support.records import add_project

KEY = SigningKey.generate()
FIXTURES = Path(__file__).parent / "fixtures" / "v1"
PIN_BODY = b'{"model":"echo-1","messages":[{"role":"user","content":"1234"}]}'
RESPONSE = b'{"choices":[{"message":{"content":"1234"}}]}'


def settlement(receipt_id: str, **fields) -> Settlement:
    values = {
        "receipt_id": receipt_id,
        "request_id": "req_1",
        "kind": "inference",
        "endpoint": "/v1/chat/completions",
        "subject": "echo-1",
        "status": "succeeded",
        "usage": {"input_tokens": 4, "output_tokens": 1},
        "cost": 7,
        "request_body": PIN_BODY,
        "response_sha256": hashlib.sha256(RESPONSE).hexdigest(),
    }
    return Settlement(**(values | fields))


def as_json(doc) -> dict:
    return msgspec.json.decode(msgspec.json.encode(doc))


@pytest.fixture
async def storage(tmp_path):
    storage = await open_storage(f"sqlite:///{tmp_path / 'gateway.db'}")
    yield storage
    await storage.close()


@pytest.fixture
async def billed(storage):
    """billed(settlement) -> the stored receipt, charged through a real reservation and
    the meter's settle."""
    project = await add_project(storage, "commitments")
    await storage.add_credit(project.id, 10_000_000, "2025-01")
    meter = StorageMeter(storage)

    async def bill(settled: Settlement, *, legacy: bool = False):
        reservation = await meter.reserve(project.id, None, 1000)
        if legacy:  # what the version 1 code stored: no salts, no commitments
            record = msgspec.structs.replace(
                receipt_record(reservation, settled),
                request_salt=None,
                response_salt=None,
                request_commitment=None,
                response_commitment=None,
            )
            assert await storage.settle(record)
        else:
            await meter.settle(reservation, settled)
        return await storage.get_receipt(settled.receipt_id)

    return bill


@pytest.fixture
async def log(storage):
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()  # integrate only when the test says so
    yield log
    await log.stop()


async def test_each_receipt_gets_its_own_salts_and_the_commitments_open_with_them(billed):
    first = await billed(settlement("rcpt_first"))
    second = await billed(settlement("rcpt_second"))  # the very same bodies
    for record in (first, second):
        request_salt = bytes.fromhex(record.request_salt)
        response_salt = bytes.fromhex(record.response_salt)
        assert len(request_salt) == len(response_salt) == 16
        assert request_salt != response_salt
        assert record.request_commitment == hashlib.sha256(request_salt + PIN_BODY).hexdigest()
        inner = hashlib.sha256(RESPONSE).digest()
        assert record.response_commitment == hashlib.sha256(response_salt + inner).hexdigest()
        # The plain digests stay with the project's receipt.
        assert record.request_sha256 == hashlib.sha256(PIN_BODY).hexdigest()
    # Same bodies, unrelated commitments: nothing links two receipts of one prompt.
    assert first.request_salt != second.request_salt
    assert first.request_commitment != second.request_commitment
    assert first.response_commitment != second.response_commitment


async def test_a_new_receipt_is_logged_as_version_2_without_digests_or_salts(billed, log):
    record = await billed(settlement("rcpt_pin"))
    await log.integrate()
    doc = await log.proof(record.id)
    assert isinstance(doc.receipt, PublicReceipt)
    assert verify_proof_document(as_json(doc), KEY.public_key).ok
    assert set(msgspec.structs.asdict(doc.receipt)) == {
        "v",
        "id",
        "issued_at",
        "kind",
        "endpoint",
        "model_or_runtime",
        "status",
        "usage",
        "usage_source",
        "cost",
        "request_commitment",
        "response_commitment",
    }
    # The leaf as published: the log's entry bundle, rebuilt from the receipt row.
    leaf = (await log.entries(0, log.size))[doc.leaf_index].decode()
    assert '"v":2' in leaf
    assert record.request_commitment in leaf and record.response_commitment in leaf
    for private in (
        record.request_sha256,
        record.response_sha256,
        record.request_salt,
        record.response_salt,
    ):
        assert private not in leaf
    # The guess that recovered a PIN from a plain digest finds nothing any more.
    guesses = {
        hashlib.sha256(PIN_BODY.replace(b"1234", b"%04d" % n)).hexdigest() for n in range(10_000)
    }
    assert hashlib.sha256(PIN_BODY).hexdigest() in guesses  # the attack itself works
    published = {v for v in msgspec.structs.asdict(doc.receipt).values() if isinstance(v, str)}
    assert not guesses & published


async def test_an_empty_response_commits_to_the_empty_body(billed):
    record = await billed(settlement("rcpt_empty", response_sha256=None))
    salt = bytes.fromhex(record.response_salt)
    empty = hashlib.sha256(b"").digest()
    assert record.response_commitment == hashlib.sha256(salt + empty).hexdigest()


@pytest.mark.parametrize("expected", ["provider", "gateway"])
async def test_usage_source_reaches_the_receipt_and_the_public_leaf(billed, log, expected):
    record = await billed(settlement("rcpt_source", usage_source=expected))
    assert record.usage_source == expected
    assert "usage_source" not in record.usage  # usage stays counts only
    assert public_receipt(record).usage_source == expected
    await log.integrate()
    assert (await log.proof(record.id)).receipt.usage_source == expected


async def test_a_receipt_issued_before_commitments_is_logged_as_version_1(billed, log):
    """Settled by the old code (no salts: NULL columns after the migration) and not yet
    logged at the upgrade: there is no body left to commit to, so it goes in as v1, as
    the code that issued it would have logged it, beside new v2 leaves."""
    new = await billed(settlement("rcpt_new"))
    legacy = await billed(settlement("rcpt_legacy"), legacy=True)
    assert legacy.request_salt is None and legacy.request_commitment is None
    await log.integrate()
    for record, version in ((new, PublicReceipt), (legacy, PublicReceiptV1)):
        doc = await log.proof(record.id)
        assert isinstance(doc.receipt, version)
        assert verify_proof_document(as_json(doc), KEY.public_key).ok
    assert (await log.proof(legacy.id)).receipt.request_sha256 == legacy.request_sha256
    # The project's view of it: nothing to open, said as null rather than left out.
    view = receipt_view(legacy)
    assert view["request_salt"] is view["request_commitment"] is None
    assert view["usage_source"] == "provider"


async def test_a_database_of_the_version_1_code_keeps_its_log_and_continues_it(tmp_path):
    """The fixture is a deployment's database dumped by the v1 code: three chats, logged.
    Migrated and reopened, its leaves and head stand as they were; the next receipt is
    a v2 leaf of the same tree, and both versions verify against the same key."""
    path = tmp_path / "gateway.db"
    with sqlite3.connect(path) as db:
        db.executescript((FIXTURES / "gateway_v1.sql").read_text())
    db.close()
    seed = bytes.fromhex((FIXTURES / "signing-key").read_text().strip())
    key = SigningKey(seed)
    storage = await open_storage(f"sqlite:///{path}")
    try:
        old_head = await storage.tree_head()
        old_leaves = await storage.log_leaves(0)
        assert old_head.size == len(old_leaves) == 3
        log = TransparencyLog(storage, key)
        await log.start()  # refuses to start if the stored leaves no longer match
        log._task.cancel()
        project_id = (await storage.get_receipt(old_leaves[0].receipt_id)).project_id
        reservation = await StorageMeter(storage).reserve(project_id, None, 100)
        await StorageMeter(storage).settle(reservation, settlement("rcpt_after_upgrade"))
        await log.integrate()

        # The old leaves stand as they were, with their own signatures; the new one is an
        # entry of the tiles, its public receipt not stored again.
        assert await storage.log_leaves(0) == old_leaves
        assert await storage.log_leaf("rcpt_after_upgrade") is None
        assert await storage.log_entry_index("rcpt_after_upgrade") == 3
        for leaf in old_leaves:
            doc = await log.proof(leaf.receipt_id)
            assert isinstance(doc.receipt, PublicReceiptV1)
            assert doc.receipt_signature == leaf.signature
            assert verify_proof_document(as_json(doc), key.public_key).ok
        doc = await log.proof("rcpt_after_upgrade")
        assert isinstance(doc.receipt, PublicReceipt) and doc.leaf_index == 3
        assert doc.receipt_signature is None and "receipt_signature" not in as_json(doc)
        assert verify_proof_document(as_json(doc), key.public_key).ok
        first, second, proof = await log.consistency(3, 4)
        assert first.root_hash == old_head.root_hash
        assert verify_consistency(
            3, 4, bytes.fromhex(first.root_hash), bytes.fromhex(second.root_hash), proof
        )
        await log.stop()
    finally:
        await storage.close()
