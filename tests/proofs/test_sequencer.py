"""The log's one sequencer. In storage: an append is a compare-and-set on the stored tree
size (every backend), and the sequencer lock (PostgreSQL: a session advisory lock; SQLite:
a flock beside the database) is held by one handle at a time and freed when its holder
dies (or, on PostgreSQL, hangs). In the log: only the
holder integrates, the others serve its tree, and a stale holder can never fork it."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg  # type: ignore[import-untyped]
import msgspec
import pytest

from model_gateway.gateway.proofs.log import Pending, TransparencyLog
from model_gateway.gateway.proofs.log_key import SigningKey
from model_gateway.gateway.proofs.merkle import verify_consistency
from model_gateway.gateway.proofs.verify import verify_proof_document
from model_gateway.storage import StateConflict, open_storage
from model_gateway.storage.base import LogEntry, LogTile, TreeHeadRecord

KEY = SigningKey.generate()

# The PostgreSQL session setting after which the server ends a silent holder's session.
IDLE_S = 5


def hashes(*ns: int) -> bytes:
    return b"".join(bytes([n]) * 32 for n in ns)


def head(size: int, salt: int = 0) -> TreeHeadRecord:
    return TreeHeadRecord(
        size=size,
        root_hash=f"{size + salt:064x}",
        timestamp="2026-11-23T00:00:00.000000Z",
        key_id="k" * 16,
        signature=f"{size:0128x}",
    )


def append(storage, start: int, receipts, leaf_hashes: bytes, signed: TreeHeadRecord):
    entries = [LogEntry(leaf_index=start + i, receipt_id=r.id) for i, r in enumerate(receipts)]
    return storage.append_log_tiles(
        entries, [LogTile(level=0, index=0, hashes=leaf_hashes)], signed
    )


@pytest.fixture
async def two_handles(fresh_storage_url):
    """Two handles on one empty database: two gateway processes, as far as storage knows."""
    first = await open_storage(fresh_storage_url)
    second = await open_storage(fresh_storage_url)
    yield first, second
    await first.close()
    await second.close()


async def test_two_appends_from_the_same_size_one_wins_whole(two_handles, settle_on):
    first, second = two_handles
    settle = await settle_on(first)
    a, b, c = await settle(), await settle(), await settle()
    await append(first, 0, [a], hashes(1), head(1))
    # Two sequencers (one of them stale) extend size 1 with different receipts at once.
    outcomes = await asyncio.gather(
        append(first, 1, [b], hashes(1, 2), head(2, salt=100)),
        append(second, 1, [c], hashes(1, 3), head(2, salt=200)),
        return_exceptions=True,
    )
    assert sorted(type(o).__name__ for o in outcomes) == ["NoneType", "StateConflict"]
    won = 0 if outcomes[0] is None else 1
    winner, loser = [(b, hashes(1, 2), 100), (c, hashes(1, 3), 200)][won], [b, c][1 - won]
    for storage in two_handles:
        assert await storage.tree_head() == head(2, salt=winner[2])
        assert await storage.log_tiles([(0, 0)]) == {(0, 0): winner[1]}
        assert await storage.log_entry_index(winner[0].id) == 1
        assert await storage.log_entry_index(loser.id) is None
        assert [r.id for r in await storage.unlogged_receipts(5)] == [loser.id]


@pytest.mark.parametrize(
    ("start", "size"), [(2, 3), (1, 3)], ids=["leaves-a-gap", "signs-more-than-it-adds"]
)
async def test_an_append_that_does_not_continue_the_stored_size_is_refused(
    two_handles, settle_on, start, size
):
    storage, _ = two_handles
    settle = await settle_on(storage)
    a, b = await settle(), await settle()
    await append(storage, 0, [a], hashes(1), head(1))
    # Every key is new and the tile only grows: only the size check can refuse it.
    with pytest.raises(StateConflict):
        await append(storage, start, [b], hashes(1, 2, 3), head(size))
    assert await storage.tree_head() == head(1)
    assert await storage.log_tiles([(0, 0)]) == {(0, 0): hashes(1)}
    assert await storage.log_entry_index(b.id) is None
    # The same batch where the log ends goes in.
    await append(storage, 1, [b], hashes(1, 2), head(2))
    assert await storage.tree_head() == head(2)


async def test_on_sqlite_one_handle_holds_the_lock_until_it_closes(tmp_path):
    url = f"sqlite:///{tmp_path}/one.db"
    a, b = await open_storage(url), await open_storage(url)
    try:
        assert await a.claim_log_sequencer() and await a.claim_log_sequencer()
        assert not await b.claim_log_sequencer()
        await a.close()
        assert await b.claim_log_sequencer()
    finally:
        await b.close()


HOLD_THE_LOCK = """
import asyncio, sys
from model_gateway.storage import open_storage
async def main():
    storage = await open_storage(sys.argv[1])
    assert await storage.claim_log_sequencer()
    print("held", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_on_sqlite_a_killed_holders_lock_is_freed_by_the_kernel(tmp_path):
    url = f"sqlite:///{tmp_path}/one.db"
    await (await open_storage(url)).close()  # the schema first, by one process
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLD_THE_LOCK, url, stdout=asyncio.subprocess.PIPE
    )
    storage = await open_storage(url)
    try:
        assert await asyncio.wait_for(holder.stdout.readline(), 30) == b"held\n"
        assert not await storage.claim_log_sequencer()
        holder.kill()
        await holder.wait()
        assert await claimed_within(storage, 5) < 5
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await storage.close()


# --- the lock, on PostgreSQL ----------------------------------------------------------


async def lock_holders(url: str) -> list[int]:
    """The backend pids that hold the sequencer's advisory lock (from pg_locks)."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted"
            " AND a.application_name = 'model-gateway-sequencer'"
            " AND a.datname = current_database()"
        )
        return [row["pid"] for row in rows]
    finally:
        await conn.close()


async def end_session(url: str, pid: int) -> None:
    """What the server does to a crashed or hung holder's session."""
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await conn.close()


async def claimed_within(storage, seconds: float) -> float:
    """How long `storage` took to get the lock, claiming as a follower does (raises if not)."""
    started = time.monotonic()
    while not await storage.claim_log_sequencer():
        assert time.monotonic() - started < seconds, "the lock was never freed"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.postgres
async def test_one_handle_holds_the_lock_until_its_session_ends(fresh_postgres_url):
    a = await open_storage(fresh_postgres_url)
    b = await open_storage(fresh_postgres_url)
    try:
        assert await a.claim_log_sequencer()
        assert not await b.claim_log_sequencer()
        assert await a.claim_log_sequencer()  # still held: the holder's call is a ping
        assert not await b.claim_log_sequencer()
        [holder] = await lock_holders(fresh_postgres_url)
        # a's process dies (kill -9 closes its socket): its session ends, the lock is free.
        await end_session(fresh_postgres_url, holder)
        await claimed_within(b, 5)
        assert not await a.claim_log_sequencer()  # a finds its session gone: not the sequencer
        assert not await a.claim_log_sequencer()  # and a new session of a cannot have it
        assert len(await lock_holders(fresh_postgres_url)) == 1
        await b.close()  # a graceful stop frees it too
        await claimed_within(a, 5)
    finally:
        await a.close()
        await b.close()


@pytest.mark.postgres
async def test_a_hung_holder_loses_the_lock_to_the_server(fresh_postgres_url):
    a = await open_storage(fresh_postgres_url)
    b = await open_storage(fresh_postgres_url)
    try:
        assert await a.claim_log_sequencer()
        # a stops calling (its event loop is stuck, or its host is cut off): the server
        # ends its idle session after IDLE_S and b, claiming as followers do, takes over.
        waited = await claimed_within(b, IDLE_S + 5)
        assert IDLE_S - 1 < waited
        assert not await a.claim_log_sequencer()
    finally:
        await a.close()
        await b.close()


# --- the log, on PostgreSQL: two processes' logs, one storage handle each ----------------


def as_json(doc) -> dict:
    return msgspec.json.decode(msgspec.json.encode(doc))


@asynccontextmanager
async def logs_on(url: str) -> AsyncIterator[list[TransparencyLog]]:
    """Two processes' logs on one database, started in turn, looping fast."""
    handles = [await open_storage(url) for _ in range(2)]
    logs = [TransparencyLog(h, KEY, interval_s=0.02, follow_s=0.05) for h in handles]
    for log in logs:
        await log.start()
    yield logs
    for log, handle in zip(logs, handles, strict=True):
        await log.stop()
        await handle.close()


@pytest.fixture
async def two_logs(fresh_storage_url):
    async with logs_on(fresh_storage_url) as logs:
        yield logs


async def proven(log: TransparencyLog, receipt_id: str) -> dict:
    """The receipt's proof from `log`, waiting while it is pending (at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return as_json(await log.proof(receipt_id))
        except Pending:
            assert time.monotonic() < deadline, "never integrated"
            await asyncio.sleep(0.02)


async def assert_one_tree(storage, log: TransparencyLog) -> None:
    """Every stored head is a prefix of the latest: one tree, no fork, no gap."""
    latest = await storage.tree_head()
    for size in range(1, latest.size):
        earlier = await storage.tree_head(size)
        if earlier is None:
            continue
        _, _, proof = await log.consistency(size, latest.size)
        assert verify_consistency(
            size,
            latest.size,
            bytes.fromhex(earlier.root_hash),
            bytes.fromhex(latest.root_hash),
            proof,
        )


async def test_only_the_sequencer_integrates_and_a_follower_serves_its_tree(two_logs, settle_on):
    sequencer, follower = two_logs
    assert sequencer.sequencer and not follower.sequencer
    integrations = []  # whether the follower was sequencer at each of its integrations
    integrate = follower.integrate

    async def counted() -> int:
        integrations.append(follower.sequencer)
        return await integrate()

    follower.integrate = counted  # type: ignore[method-assign]
    settled = []
    for log in two_logs:  # receipts settled by both processes
        settle = await settle_on(log.storage)
        settled += [await settle() for _ in range(4)]
    docs = [await proven(follower, r.id) for r in settled]
    assert sorted(doc["leaf_index"] for doc in docs) == list(range(8))
    assert all(verify_proof_document(doc, KEY.public_key).ok for doc in docs)
    assert follower.size == sequencer.size == 8
    assert not follower.sequencer
    assert await follower.checkpoint() == await sequencer.checkpoint()
    await assert_one_tree(follower.storage, follower)
    assert integrations == []

    # The sequencer stops (its session ends): the follower takes over and goes on.
    await sequencer.stop()
    await sequencer.storage.close()
    deadline = time.monotonic() + 5
    while not follower.sequencer:
        assert time.monotonic() < deadline, "no takeover"
        await asyncio.sleep(0.02)
    settle = await settle_on(follower.storage)
    later = [await settle() for _ in range(3)]
    for n, receipt in enumerate(later, 8):
        doc = await proven(follower, receipt.id)
        assert doc["leaf_index"] == n
        assert verify_proof_document(doc, KEY.public_key).ok
    await assert_one_tree(follower.storage, follower)
    assert integrations and all(integrations)


async def test_a_follower_waits_for_no_receipt_the_sequencer_skipped(two_logs, settle_on):
    sequencer, follower = two_logs
    settle = await settle_on(sequencer.storage)
    minute_ago = time.time_ns() // 1000 - 60_000_000
    await settle(request_sha256="not a digest", created_at=minute_ago)  # never public
    logged = await settle()
    await proven(follower, logged.id)
    await asyncio.sleep(3 * follower.follow_s)  # the follower has looked again since
    assert follower.integration_lag_s < 5  # not the skipped receipt's minute


@pytest.mark.postgres
async def test_a_stale_sequencer_loses_its_append_and_steps_down(settle_on, fresh_postgres_url):
    async with logs_on(fresh_postgres_url) as two_logs:
        stale, successor = two_logs
        for log in two_logs:
            log._task.cancel()  # each step by hand
        settle = await settle_on(stale.storage)
        first = await settle()
        assert await stale.integrate() == 1
        second = await settle()
        append = stale.storage.append_log_tiles

        async def paused_before_append(*args):
            # The stale sequencer stops right before its append. The server ends its silent
            # session, the successor takes the lock and integrates the same receipt first.
            [holder] = await lock_holders(fresh_postgres_url)
            await end_session(fresh_postgres_url, holder)
            deadline = time.monotonic() + 5
            while not await successor._claim():
                assert time.monotonic() < deadline, "no takeover"
                await asyncio.sleep(0.02)
            assert successor.size == 1  # the right edge reloaded from the stored tiles
            assert await successor.integrate() == 1
            return await append(*args)  # then the stale one wakes up: its append from size 1

        stale.storage.append_log_tiles = paused_before_append
        with pytest.raises(StateConflict):
            await stale.integrate()
        stale.storage.append_log_tiles = append
        assert stale.size == 2  # it reloaded the stored tree
        assert not await stale._claim() and not stale.sequencer  # and steps down
        third = await settle()
        assert await successor.integrate() == 1
        storage = successor.storage
        indexes = [await storage.log_entry_index(r.id) for r in (first, second, third)]
        assert indexes == [0, 1, 2]
        assert [(await storage.tree_head(n)).size for n in (1, 2, 3)] == [1, 2, 3]
        for log in two_logs:
            assert verify_proof_document(as_json(await log.proof(third.id)), KEY.public_key).ok
        await assert_one_tree(storage, successor)
