"""The log integrator against a real SQLite storage: receipts in, verifiable proofs out."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import msgspec
import pytest

from model_gateway.gateway.proofs import log as log_module
from model_gateway.gateway.proofs.log import LogCorrupted, Pending, TransparencyLog, public_receipt
from model_gateway.gateway.proofs.log_key import SigningKey
from model_gateway.gateway.proofs.merkle import MerkleTree, leaf_hash, verify_consistency
from model_gateway.gateway.proofs.receipts import canonical_bytes, sign_receipt, sign_tree_head
from model_gateway.gateway.proofs.verify import verify_proof_document
from model_gateway.storage.base import LogEntry, LogTile, StorageError, TreeHeadRecord
from tests.support.records import offering_meter

KEY = SigningKey.generate()


def decode(entry: bytes) -> dict:
    return msgspec.json.decode(entry)


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


async def test_offered_and_stored_receipts_are_logged_in_issue_order_and_verify(storage, settle):
    """The sequencer logs its own process's settlements from memory and reads the rest
    (another writer's, here straight into storage) back: one order, every proof valid."""
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()
    charge = await offering_meter(storage, log.offer)
    ids = [await charge(), await charge(), (await settle()).id, await charge()]
    assert await log.integrate() == 4
    assert log.read_back == 4  # one was not offered: the batch was read back whole
    assert await storage.log_entry_receipts(0, 4) == [
        (i, await storage.get_receipt(receipt_id)) for i, receipt_id in enumerate(ids)
    ]
    for receipt_id in ids:
        result = verify_proof_document(as_json(await log.proof(receipt_id)), KEY.public_key)
        assert result.ok, result.reasons
    assert await log.integrate() == 0
    await log.stop()


async def test_a_log_running_beside_its_settlers_reads_none_of_their_receipts_back(storage):
    """The log's reads run on the loop, and may come between a batch's commit and the next
    step of the settlers it committed for: their offers must have come already."""
    log = TransparencyLog(storage, KEY, interval_s=0)  # looks at every turn it gets
    await log.start()
    charge = await offering_meter(storage, log.offer)
    ids = []
    for _ in range(10):
        ids += await asyncio.gather(*(charge() for _ in range(16)))
    await log.stop()  # integrates what is left
    assert log.size == len(ids) == 160
    assert log.read_back == 0


async def test_a_fed_log_waits_for_an_offer_before_it_reads_a_receipt_back(storage, settle):
    """The log process gets its receipts over a pipe, after their commit: one not offered
    yet is not read back until it has waited `offer_wait_s`."""
    log = TransparencyLog(storage, KEY, offer_wait_s=30)
    await log.start()
    log._task.cancel()
    first, second = await settle(), await settle()
    assert await log.integrate() == 0  # neither offered yet: wait for the first
    log.offer(first)
    assert await log.integrate() == 1 and log.read_back == 0  # the ones ahead of the second
    log.offer_wait_s = 0.5
    assert await log.integrate() == 0  # the second's wait started when first found unoffered
    await asyncio.sleep(0.55)
    assert await log.integrate() == 1 and log.read_back == 1  # waited its time: read back
    assert [r.id for _, r in await storage.log_entry_receipts(0, 2)] == [first.id, second.id]


def minute_ago() -> int:
    return time.time_ns() // 1000 - 60_000_000


async def test_the_integration_lag_shows_a_backlog_left_behind_a_full_batch(storage, settle):
    log = TransparencyLog(storage, KEY, batch=4)
    await log.start()
    log._task.cancel()
    for _ in range(10):
        await settle(created_at=minute_ago())
    assert await log.integrate() == 4
    assert log.integration_lag_s >= 59  # six minute-old receipts still wait


async def test_the_integration_lag_grows_while_batches_cannot_be_stored(storage, settle):
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()
    await settle(created_at=minute_ago())

    async def failing(*args):
        raise StorageError("SQLite append: SQLITE_IOERR")

    storage.append_log_tiles = failing
    with pytest.raises(StorageError):
        await log.integrate()
    assert log.integration_lag_s >= 59


async def test_a_receipt_issued_ahead_of_this_clock_waits_no_longer_than_any(storage, settle):
    """Another instance's clock may run ahead: the wait for an offer is timed here."""
    log = TransparencyLog(storage, KEY, offer_wait_s=0.2)
    await log.start()
    log._task.cancel()
    ahead = await settle(created_at=time.time_ns() // 1000 + 3_600_000_000)
    assert await log.integrate() == 0
    await asyncio.sleep(0.25)
    assert await log.integrate() == 1
    assert log.integration_lag_s < 5
    assert (await log.proof(ahead.id)).receipt.id == ahead.id


async def test_the_integration_lag_stays_small_while_receipts_keep_coming(storage):
    """The lag is the oldest waiting receipt's wait: under unbroken settlements a log that
    keeps up shows about its interval, never the time since it last found none waiting."""
    log = TransparencyLog(storage, KEY, interval_s=0.02)
    charge = await offering_meter(storage, log.offer)
    await log.start()
    lags = []
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        await charge()  # a receipt every few ms: never a look that finds none
        lags.append(log.integration_lag_s)
        await asyncio.sleep(0.005)
    await log.stop()
    assert log.size > 50
    assert max(lags[len(lags) // 2 :]) < 0.5, max(lags)


async def test_a_row_altered_between_settlement_and_logging_is_caught(storage, tmp_path):
    """The leaf is what was settled, not what the row says later: an UPDATE before the log
    took the receipt makes its proof fail, as it does after."""
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()
    charge = await offering_meter(storage, log.offer)
    altered, kept = await charge(), await charge()
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        db.execute("UPDATE receipts SET cost = cost - 50 WHERE id = ?", (altered,))
    db.close()
    assert await log.integrate() == 2
    with pytest.raises(LogCorrupted, match="no longer matches its leaf"):
        await log.proof(altered)
    assert verify_proof_document(as_json(await log.proof(kept)), KEY.public_key).ok
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
    assert await storage.log_entry_index(record.id) == 0


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
    indexes = [await storage.log_entry_index(r.id) for r in records + more]
    assert indexes == list(range(5))
    assert (await storage.tree_head()).size == 5


async def test_a_failed_append_leaves_the_memory_tree_as_stored(storage, settle):
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()
    await settle()
    await log.integrate()
    record = await settle()

    async def refuse(entries, tiles, head):
        raise RuntimeError("disk full")

    original, storage.append_log_tiles = storage.append_log_tiles, refuse
    with pytest.raises(RuntimeError):
        await log.integrate()
    storage.append_log_tiles = original
    assert log.size == 1
    assert await log.integrate() == 1
    assert verify_proof_document(as_json(await log.proof(record.id)), KEY.public_key).ok


async def test_a_log_that_does_not_match_its_signed_head_refuses_to_start(storage, settle):
    record = await settle()
    leaf = leaf_hash(canonical_bytes(public_receipt(record)))
    # Signed by the log key, but over a root the stored tiles do not give.
    head = TreeHeadRecord(
        **msgspec.structs.asdict(
            sign_tree_head(KEY, 1, b"\x07" * 32, "2025-01-01T00:00:00.000000Z")
        )
    )
    await storage.append_log_tiles(
        [LogEntry(leaf_index=0, receipt_id=record.id)],
        [LogTile(level=0, index=0, hashes=leaf)],
        head,
    )
    with pytest.raises(LogCorrupted, match="do not hash to the signed tree head"):
        await TransparencyLog(storage, KEY).start()


async def test_a_head_the_log_key_did_not_sign_is_never_restated_as_a_checkpoint(storage, settle):
    record = await settle()
    leaf = leaf_hash(canonical_bytes(public_receipt(record)))
    other = SigningKey.generate()
    head = TreeHeadRecord(
        **msgspec.structs.asdict(sign_tree_head(other, 1, leaf, "2025-01-01T00:00:00.000000Z"))
    )
    await storage.append_log_tiles(
        [LogEntry(leaf_index=0, receipt_id=record.id)],
        [LogTile(level=0, index=0, hashes=leaf)],
        head,
    )
    with pytest.raises(LogCorrupted, match="not signed by the log key"):
        await TransparencyLog(storage, KEY).start()


async def test_a_receipt_row_altered_after_logging_is_refused_not_proven(storage, settle, tmp_path):
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()
    record, other = await settle(), await settle()
    await log.integrate()
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        db.execute("UPDATE receipts SET cost = cost + 1 WHERE id = ?", (record.id,))
    db.close()
    with pytest.raises(LogCorrupted, match="no longer matches its leaf"):
        await log.proof(record.id)
    with pytest.raises(LogCorrupted):
        await log.entries(0, 2)
    assert verify_proof_document(as_json(await log.proof(other.id)), KEY.public_key).ok
    await log.stop()


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


async def test_a_skipped_receipt_is_forgotten_once_the_log_has_passed_it(storage, settle):
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()
    bad = await settle(request_sha256="not a digest")
    await log.integrate()
    await log.integrate()
    assert log._skipped == {bad.id}  # nothing logged after it: it still comes back
    await settle()
    await log.integrate()  # logs the next receipt, and so passes the skipped one
    await log.integrate()
    assert log._skipped == set()
    await log.stop()


async def test_proofs_across_tiles_after_a_restart_with_only_the_right_edge_in_memory(
    storage, settle
):
    first = TransparencyLog(storage, KEY, batch=100)  # batches straddle tile boundaries
    await first.start()
    first._task.cancel()
    records = [await settle() for _ in range(530)]
    while await first.integrate():
        pass
    assert first.size == 530
    # In memory: one partial tile a level (530 = 2 full tiles + 18; level 1 holds 2).
    assert {k: len(v) // 32 for k, v in first._edge.tiles().items()} == {(0, 2): 18, (1, 0): 2}
    mid_head = await storage.tree_head()
    await first.stop()

    second = TransparencyLog(storage, KEY)
    await second.start()
    second._task.cancel()
    more = [await settle() for _ in range(3)]
    await second.integrate()
    assert second.size == 533
    for record in (records[0], records[255], records[256], records[511], records[529], more[-1]):
        doc = as_json(await second.proof(record.id))
        assert verify_proof_document(doc, KEY.public_key).ok
        assert "receipt_signature" not in doc and doc["checkpoint"].startswith(
            "gateway.local/log\n533\n"
        )
    _, latest, proof = await second.consistency(mid_head.size, 533)
    assert verify_consistency(
        mid_head.size,
        533,
        bytes.fromhex(mid_head.root_hash),
        bytes.fromhex(latest.root_hash),
        proof,
    )
    bundle = await second.entries(1, 256)
    assert [decode(e)["id"] for e in bundle] == [r.id for r in records[256:512]]
    assert await second.entries(2, 22) is None  # no head covers leaf 533
    assert (await second.tile(0, 2, 21)).startswith(await second.tile(0, 2, 20))
    assert await second.tile(0, 2, 22) is None and await second.tile(1, 0, 3) is None
    await second.stop()


@pytest.mark.parametrize("chunk", [4096, 256, 100])
async def test_a_log_written_before_tiles_gets_its_tiles_once_and_goes_on(
    storage, settle, tmp_path, monkeypatch, chunk
):
    """Leaves stored the old way (public receipt and signature per leaf) across more than
    two tiles: the first start builds their tiles from the stored bytes (read `chunk` at a
    time), their proofs keep their signatures, and new receipts continue the same tree."""
    monkeypatch.setattr(log_module, "BACKFILL_CHUNK", chunk)
    records = [await settle() for _ in range(600)]
    leaves = [canonical_bytes(public_receipt(r)) for r in records]
    tree = MerkleTree([leaf_hash(b) for b in leaves])
    old = sign_tree_head(KEY, 600, tree.root(), "2025-01-01T00:00:00.000000Z")
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        db.executemany(
            "INSERT INTO log_leaves VALUES (?, ?, ?, ?)",
            [
                (i, r.id, leaf, sign_receipt(KEY, public_receipt(r)))
                for i, (r, leaf) in enumerate(zip(records, leaves, strict=True))
            ],
        )
        db.execute(
            "INSERT INTO tree_heads VALUES (?, ?, ?, ?, ?)",
            (old.size, old.root_hash, old.timestamp, old.key_id, old.signature),
        )
    db.close()
    log = TransparencyLog(storage, KEY)
    await log.start()
    log._task.cancel()
    assert log.size == 600
    assert await storage.log_tiles([(0, 0), (0, 1), (0, 2), (1, 0)]) == {
        (0, 0): b"".join(leaf_hash(b) for b in leaves[:256]),
        (0, 1): b"".join(leaf_hash(b) for b in leaves[256:512]),
        (0, 2): b"".join(leaf_hash(b) for b in leaves[512:]),
        (1, 0): tree.root(256) + MerkleTree([leaf_hash(b) for b in leaves[256:512]]).root(),
    }
    doc = as_json(await log.proof(records[300].id))
    assert doc["receipt_signature"] and verify_proof_document(doc, KEY.public_key).ok
    assert await log.entries(2, 88) == leaves[512:]
    # Building them again writes the same bytes: an interrupted first start just reruns.
    await log._build_legacy_tiles(600)
    new = await settle()
    await log.integrate()
    doc = as_json(await log.proof(new.id))
    assert doc["leaf_index"] == 600 and verify_proof_document(doc, KEY.public_key).ok
    _, latest, proof = await log.consistency(600, 601)
    assert verify_consistency(
        600, 601, bytes.fromhex(old.root_hash), bytes.fromhex(latest.root_hash), proof
    )
    mixed = await log.entries(2, 89)
    assert mixed[:88] == leaves[512:] and decode(mixed[88])["id"] == new.id
    await log.stop()
    restarted = TransparencyLog(storage, KEY)
    await restarted.start()
    assert restarted.size == 601
    await restarted.stop()


async def test_two_integrators_racing_for_the_same_receipts_never_fork(storage, settle):
    a, b = TransparencyLog(storage, KEY), TransparencyLog(storage, KEY)
    for log in (a, b):
        await log.start()
        log._task.cancel()
    records = [await settle() for _ in range(3)]
    for log in (a, b):  # offered to both: neither awaits a read, so neither sees the other
        for record in records:  # append before its own
            log.offer(record)
    # Both read the same unlogged receipts and append at the same index: one loses whole.
    outcomes = await asyncio.gather(a.integrate(), b.integrate(), return_exceptions=True)
    assert sorted(type(o).__name__ for o in outcomes) == ["StateConflict", "int"]
    more = await settle()
    loser = a if isinstance(outcomes[0], Exception) else b
    assert await loser.integrate() == 1  # reloaded from the stored tiles, goes on
    assert [await storage.log_entry_index(r.id) for r in [*records, more]] == [0, 1, 2, 3]
    heads = [await storage.tree_head(size) for size in range(1, 5)]
    assert [h is not None for h in heads] == [False, False, True, True]
    for log in (a, b):
        doc = as_json(await log.proof(more.id))
        assert verify_proof_document(doc, KEY.public_key).ok
        assert doc["tree_head"]["root_hash"] == heads[-1].root_hash
