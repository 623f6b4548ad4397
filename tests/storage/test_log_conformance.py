"""The transparency log's and the sandboxes' storage, on every backend."""

from __future__ import annotations

import itertools

import pytest

from model_gateway.storage import (
    ProjectRecord,
    ReceiptRecord,
    RecordNotFound,
    ReservationRecord,
    SandboxRecord,
    StateConflict,
    TreeHeadRecord,
    open_storage,
)
from model_gateway.storage.base import LogEntry, LogTile, new_id

MONTH = "2026-11"
_n = itertools.count()


@pytest.fixture
async def storage(fresh_storage_url):
    """An empty database of each backend: the log is global to a database."""
    backend = await open_storage(fresh_storage_url)
    yield backend
    await backend.close()


async def issue(storage, count: int, descending_ids: bool = False) -> list[ReceiptRecord]:
    """`count` receipts, settled one after the other through real holds (their ids sort
    against their issue order when `descending_ids`)."""
    pid = new_id("prj")
    await storage.create_project(ProjectRecord(id=pid, name="log"))
    await storage.add_credit(pid, 10_000, MONTH)
    receipts = []
    for _ in range(count):
        hold = ReservationRecord(
            id=new_id("rsv"),
            project_id=pid,
            key_id=None,
            amount=10,
            month=MONTH,
            owner="log:1:1",
            lease_until=2**40,
            created_at=0,
        )
        await storage.reserve(hold)
        n = next(_n)
        receipt = ReceiptRecord(
            id=f"rcpt_{10**12 - n if descending_ids else n:012d}",
            reservation_id=hold.id,
            project_id=pid,
            key_id=None,
            request_id=f"req_{n}",
            kind="inference",
            endpoint="/v1/responses",
            model_or_runtime="echo-1",
            status="succeeded",
            usage={"input_tokens": n},
            cost=7,
            month=MONTH,
            created_at=10**15 + n,
            request_sha256="a" * 64,
            response_sha256="b" * 64,
        )
        assert await storage.settle(receipt)
        receipts.append(receipt)
    return receipts


def entries(start: int, receipts: list[ReceiptRecord]) -> list[LogEntry]:
    return [LogEntry(leaf_index=start + i, receipt_id=r.id) for i, r in enumerate(receipts)]


def hashes(count: int, salt: int = 0) -> bytes:
    """`count` distinct 32-byte hashes (the n-th is the same for every count)."""
    return b"".join(bytes([(n + salt) % 256]) * 32 for n in range(count))


def tile(level: int, index: int, data: bytes) -> LogTile:
    return LogTile(level=level, index=index, hashes=data)


def head(size: int) -> TreeHeadRecord:
    return TreeHeadRecord(
        size=size,
        root_hash=f"{size:064x}",
        timestamp=f"2026-11-23T00:00:{size:02d}.000000Z",
        key_id="k" * 16,
        signature=f"{size:0128x}",
    )


async def test_an_empty_log_has_no_head_and_no_leaves(storage):
    assert await storage.tree_head() is None
    assert await storage.log_leaves() == []
    assert await storage.unlogged_receipts(10) == []
    assert await storage.unlogged_receipt_ids(10) == []


async def test_settled_receipts_wait_for_the_log_in_issue_order(storage):
    receipts = await issue(storage, 5)
    assert await storage.unlogged_receipts(10) == receipts
    assert await storage.unlogged_receipts(2) == receipts[:2]
    assert await storage.unlogged_receipt_ids(10) == [(r.id, r.created_at) for r in receipts]
    assert await storage.unlogged_receipt_ids(2) == [(r.id, r.created_at) for r in receipts[:2]]


async def test_the_queue_keeps_issue_order_whatever_the_ids(storage):
    receipts = await issue(storage, 4, descending_ids=True)
    assert [r.id for r in receipts] == sorted((r.id for r in receipts), reverse=True)
    assert await storage.unlogged_receipt_ids(10) == [(r.id, r.created_at) for r in receipts]
    assert await storage.unlogged_receipt_ids(3) == [(r.id, r.created_at) for r in receipts[:3]]
    assert await storage.unlogged_receipts(10) == receipts


async def test_appended_entries_tiles_and_heads_read_back_and_leave_the_queue(storage):
    receipts = await issue(storage, 5)
    await storage.append_log_tiles(entries(0, receipts[:3]), [tile(0, 0, hashes(3))], head(3))
    assert await storage.unlogged_receipts(10) == receipts[3:]
    assert await storage.unlogged_receipt_ids(10) == [(r.id, r.created_at) for r in receipts[3:]]
    await storage.append_log_tiles(
        entries(3, receipts[3:]), [tile(0, 0, hashes(5)), tile(1, 0, hashes(1, 9))], head(5)
    )

    assert await storage.log_tiles([(0, 0), (1, 0), (0, 1), (0, 0)]) == {
        (0, 0): hashes(5),
        (1, 0): hashes(1, 9),
    }
    assert await storage.log_tiles([]) == {}
    assert await storage.log_entry_index(receipts[4].id) == 4
    assert await storage.log_entry_index("rcpt_not_logged") is None
    assert await storage.log_entry_receipts(1, 4) == [(i, receipts[i]) for i in (1, 2, 3)]
    assert await storage.log_entry_receipts(5, 9) == []
    # Leaves logged with tiles are not old-format leaves.
    assert await storage.log_leaves() == []
    assert await storage.log_leaf(receipts[0].id) is None
    assert await storage.tree_head() == head(5)
    assert await storage.tree_head(3) == head(3)
    assert await storage.tree_head(4) is None
    assert await storage.unlogged_receipts(10) == []


async def test_a_receipt_skipped_as_unloggable_waits_for_no_one_once_the_next_is_logged(
    storage,
):
    # The sequencer skips a receipt whose public form does not validate and logs the next:
    # no process (a follower measuring the log's lag) may see the skipped one waiting.
    skipped, logged = await issue(storage, 2)
    await storage.skip_unloggable([skipped.id])
    await storage.append_log_tiles(entries(0, [logged]), [tile(0, 0, hashes(1))], head(1))
    assert await storage.unlogged_receipt_ids(10) == []
    assert await storage.unlogged_receipts(10) == []


async def test_an_append_that_reuses_an_index_is_refused_whole(storage):
    receipts = await issue(storage, 3)
    await storage.append_log_tiles(entries(0, receipts[:1]), [tile(0, 0, hashes(1))], head(1))
    # Another integrator, behind: its batch starts at an index already taken.
    with pytest.raises(StateConflict):
        await storage.append_log_tiles(
            [
                LogEntry(leaf_index=1, receipt_id=receipts[1].id),
                LogEntry(leaf_index=0, receipt_id=receipts[2].id),
            ],
            [tile(0, 0, hashes(3))],
            head(2),
        )
    assert await storage.log_entry_index(receipts[1].id) is None
    assert await storage.log_tiles([(0, 0)]) == {(0, 0): hashes(1)}
    assert await storage.tree_head() == head(1)
    assert await storage.unlogged_receipts(10) == receipts[1:]


async def test_a_receipt_is_logged_once(storage):
    receipts = await issue(storage, 1)
    await storage.append_log_tiles(entries(0, receipts), [tile(0, 0, hashes(1))], head(1))
    with pytest.raises(StateConflict):
        await storage.append_log_tiles(entries(1, receipts), [tile(0, 0, hashes(2))], head(2))
    assert await storage.tree_head() == head(1)
    assert await storage.log_tiles([(0, 0)]) == {(0, 0): hashes(1)}


@pytest.mark.parametrize(
    "replacement",
    [hashes(1), hashes(3, 1), hashes(2, 1) + hashes(1)],
    ids=["shrinks", "changes-a-hash", "changes-then-grows"],
)
async def test_a_tile_only_grows_and_a_refused_append_writes_nothing(storage, replacement):
    receipts = await issue(storage, 3)
    await storage.append_log_tiles(entries(0, receipts[:2]), [tile(0, 0, hashes(2))], head(2))
    with pytest.raises(StateConflict):
        await storage.append_log_tiles(
            entries(2, receipts[2:]), [tile(1, 0, hashes(1)), tile(0, 0, replacement)], head(3)
        )
    assert await storage.log_entry_index(receipts[2].id) is None
    assert await storage.log_tiles([(0, 0), (1, 0)]) == {(0, 0): hashes(2)}
    assert await storage.tree_head() == head(2)
    # The same bytes again are allowed (a conversion re-run), with no head.
    await storage.append_log_tiles([], [tile(0, 0, hashes(2))], None)
    assert await storage.tree_head() == head(2)


async def test_a_size_signed_twice_is_refused(storage):
    receipts = await issue(storage, 2)
    await storage.append_log_tiles(entries(0, receipts[:1]), [tile(0, 0, hashes(1))], head(1))
    with pytest.raises(StateConflict):
        await storage.append_log_tiles(entries(1, receipts[1:]), [tile(0, 0, hashes(2))], head(1))
    assert await storage.log_entry_index(receipts[1].id) is None
    assert await storage.log_tiles([(0, 0)]) == {(0, 0): hashes(1)}


async def test_a_sandbox_configuration_round_trips(storage):
    pid = new_id("prj")
    await storage.create_project(ProjectRecord(id=pid, name="sbx"))
    sandbox = SandboxRecord(
        id=new_id("sbx"), project_id=pid, runtime="python", timeout_s=30, memory_mb=256
    )
    assert await storage.create_sandbox(sandbox) == sandbox
    assert await storage.get_sandbox(sandbox.id) == sandbox
    assert await storage.get_sandbox("sbx_missing") is None
    with pytest.raises(RecordNotFound):
        await storage.create_sandbox(
            SandboxRecord(
                id=new_id("sbx"), project_id="prj_missing", runtime="bash", timeout_s=1, memory_mb=1
            )
        )
