"""The batcher both backends queue their writes with (storage/batching.py): items of one
loop turn go together, each caller gets its own outcome, and nobody waits forever."""

from __future__ import annotations

import asyncio
import time

import pytest

from model_gateway.storage import batching
from model_gateway.storage.batching import BUSY_WINDOW_S, Batcher


async def test_the_items_of_one_turn_share_a_batch_and_keep_their_outcomes():
    batches: list[list[int]] = []

    async def run(batch: list[int]) -> list[object]:
        batches.append(batch)
        return [ValueError(item) if item % 2 else item * 10 for item in batch]

    batcher = Batcher(run, max_batch=3)
    outcomes = await asyncio.gather(*(batcher.submit(i) for i in range(5)), return_exceptions=True)
    assert batches == [[0, 1, 2], [3, 4]]
    assert [o if isinstance(o, int) else type(o) for o in outcomes] == [
        0, ValueError, 20, ValueError, 40
    ]  # fmt: skip


async def test_with_time_to_spare_requests_in_lockstep_go_on_in_groups():
    """The loop idle: batches of `lockstep_batch`, each batch's callers going on before the
    next batch commits (not all after the last one)."""
    happened: list[str] = []

    async def run(batch: list[int]) -> list[object]:
        happened.append(f"commit {batch}")
        return list(batch)

    async def request(n: int) -> None:
        await batcher.submit(n)
        happened.append(f"go on {n}")

    batcher = Batcher(run, max_batch=256, lockstep_batch=2)
    await asyncio.sleep(BUSY_WINDOW_S * 1.5)  # an idle window
    await asyncio.gather(*(request(n) for n in range(5)))
    assert happened == [
        "commit [0, 1]", "go on 0", "go on 1",
        "commit [2, 3]", "go on 2", "go on 3",
        "commit [4]", "go on 4",
    ]  # fmt: skip


async def test_a_busy_loop_commits_them_all_at_once(monkeypatch):
    """The loop's thread busy on CPU: one commit for every request waiting is worth most."""
    # A low bar: on a loaded machine (the other test workers) a spinning thread gets only
    # a part of a core; what is tested is that the measured share decides.
    monkeypatch.setattr(batching, "BUSY_SHARE", 0.2)
    batches: list[list[int]] = []

    async def run(batch: list[int]) -> list[object]:
        batches.append(batch)
        return list(batch)

    batcher = Batcher(run, max_batch=256, lockstep_batch=2)
    deadline = time.monotonic() + BUSY_WINDOW_S * 1.5
    while time.monotonic() < deadline:  # the loop's thread busy, as under load
        sum(range(1000))
    await asyncio.gather(*(batcher.submit(n) for n in range(5)))
    assert batches == [[0, 1, 2, 3, 4]]


async def test_with_time_to_spare_a_backlog_goes_in_one_batch():
    """The loop idle but more waiting than BACKLOG_BATCHES lockstep batches (hundreds of
    requests in flight behind a slow upstream): one batch takes them all, not a batch of
    `lockstep_batch` a loop turn while the queue grows."""
    batches: list[list[int]] = []

    async def run(batch: list[int]) -> list[object]:
        batches.append(batch)
        return list(batch)

    batcher = Batcher(run, max_batch=256, lockstep_batch=2)
    await asyncio.sleep(BUSY_WINDOW_S * 1.5)  # an idle window
    backlog = 2 * batching.BACKLOG_BATCHES + 1
    await asyncio.gather(*(batcher.submit(n) for n in range(backlog)))
    assert batches == [list(range(backlog))]


async def test_a_batch_that_fails_fails_each_of_its_items():
    async def run(batch: list[int]) -> list[object]:
        raise OSError("disk gone")

    batcher = Batcher(run, max_batch=8)
    outcomes = await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)
    assert [str(o) for o in outcomes] == ["disk gone"] * 3


async def test_a_cancelled_close_leaves_the_batch_running():
    release = asyncio.Event()

    async def run(batch: list[int]) -> list[object]:
        await release.wait()
        return batch

    batcher = Batcher(run, max_batch=8)
    item = asyncio.ensure_future(batcher.submit(7))
    await asyncio.sleep(0.01)  # the batch is running
    closing = asyncio.ensure_future(batcher.close())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    release.set()
    assert await asyncio.wait_for(item, 1) == 7
    await batcher.close()


async def test_a_cancelled_batch_cancels_its_callers_instead_of_leaving_them_waiting():
    async def run(batch: list[int]) -> list[object]:
        await asyncio.Event().wait()  # never ends: the loop is closing
        return batch

    batcher = Batcher(run, max_batch=1)
    first, second = (asyncio.ensure_future(batcher.submit(i)) for i in range(2))
    await asyncio.sleep(0.01)
    batcher._flusher.cancel()  # what shutting the loop down does to it
    for caller in (first, second):
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(caller, 1)
