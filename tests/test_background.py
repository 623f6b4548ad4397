"""Background loops stop even when a cancel is lost, as Python 3.11's `asyncio.wait_for`
can lose one: the log's stop once waited forever on a loop that went on."""

from __future__ import annotations

import asyncio

import pytest

from model_gateway.gateway.cluster.background import stop_tasks


def loop_that_drops(cancels: int) -> tuple[asyncio.Task, list[int]]:
    """A loop that carries on after its first `cancels` cancels, as a lost cancel does."""
    dropped = [0]

    async def loop() -> None:
        while True:
            try:
                await asyncio.sleep(0.005)
            except asyncio.CancelledError:
                if dropped[0] == cancels:
                    raise
                dropped[0] += 1

    return asyncio.create_task(loop()), dropped


async def test_a_loop_that_lost_its_cancels_is_cancelled_until_it_ends():
    task, dropped = loop_that_drops(cancels=2)
    await asyncio.sleep(0.01)
    await asyncio.wait_for(stop_tasks(task), 5)
    assert task.cancelled() and dropped == [2]


async def test_one_cancel_alone_would_have_waited_forever():
    """What stop_tasks replaces: cancel once, then wait."""
    task, _ = loop_that_drops(cancels=1)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(task), 0.5)
    await stop_tasks(task)
    assert task.done()


async def test_tasks_that_failed_or_never_started_are_stopped_quietly():
    async def fails() -> None:
        raise RuntimeError("a loop that died on its own")

    failed = asyncio.create_task(fails())
    healthy, _ = loop_that_drops(cancels=0)
    await asyncio.sleep(0.01)
    await stop_tasks(failed, None, healthy)  # nothing raised: their outcomes are retrieved
    assert failed.done() and healthy.cancelled()


async def test_a_cancelled_caller_still_leaves_no_loop_running():
    task, dropped = loop_that_drops(cancels=3)
    await asyncio.sleep(0.01)
    stopper = asyncio.create_task(stop_tasks(task))
    await asyncio.sleep(0)
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert task.done() and dropped == [3]
