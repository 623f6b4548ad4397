"""The bound on each of a stream's waits for its upstream (gateway/inference/wait_bound.py):
one timer for all the waits, asyncio.timeout's outcome for each. Real waits on the
running loop, bounds of a few tens of milliseconds."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop

from model_gateway.gateway.inference.wait_bound import WaitBound

BOUND_S = 0.05


async def test_a_wait_longer_than_the_bound_times_out_at_the_bound():
    bound = WaitBound(BOUND_S)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        with bound:
            await asyncio.sleep(10)
    assert BOUND_S <= time.monotonic() - started < BOUND_S + 0.5
    assert asyncio.current_task().cancelling() == 0  # its own cancellation is balanced
    bound.close()


async def test_short_waits_never_add_up_and_time_between_them_does_not_count():
    bound = WaitBound(BOUND_S)
    for _ in range(8):  # back to back, 0.6 of the bound each: the timer fires mid-wait
        with bound:
            await asyncio.sleep(BOUND_S * 0.6)
    for _ in range(4):
        with bound:
            await asyncio.sleep(BOUND_S * 0.6)
        await asyncio.sleep(BOUND_S * 1.5)  # between waits: not bounded
    bound.close()


async def test_the_bound_keeps_working_after_a_timeout():
    bound = WaitBound(BOUND_S)
    with pytest.raises(TimeoutError):
        with bound:
            await asyncio.sleep(10)
    with bound:
        assert await asyncio.sleep(BOUND_S / 5, "answered") == "answered"
    with pytest.raises(TimeoutError):
        with bound:
            await asyncio.sleep(10)
    bound.close()


async def test_a_cancellation_from_outside_stays_a_cancellation():
    bound = WaitBound(10)

    async def waiting() -> None:
        with bound:
            await asyncio.sleep(10)

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    bound.close()


async def test_a_cancellation_from_outside_wins_over_an_expiry_at_the_same_time():
    bound = WaitBound(BOUND_S)

    async def waiting() -> None:
        with bound:
            await asyncio.sleep(10)

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0)  # the task waits, its timer armed
    loop = asyncio.get_running_loop()
    loop.call_at(loop.time() + BOUND_S * 1.2, task.cancel)  # the client leaves just after
    time.sleep(BOUND_S * 2)  # the loop is held: both callbacks come due in one turn
    with pytest.raises(asyncio.CancelledError):
        await task
    bound.close()


def test_on_uvloop_an_expiry_fires_its_timer_once():
    """uvloop's timers round to the millisecond and may fire while its clock still reads a
    hair short of their time: the bound trusts the loop, rather than spinning on the timer
    until the clock agrees (review, 2026-11-26: up to ~300 fires an expiry)."""

    class Counted(WaitBound):
        checks = 0

        def _check(self) -> None:
            self.checks += 1
            super()._check()

    async def expiries(timeout_s: float) -> int:
        bound = Counted(timeout_s)
        for _ in range(10):
            with pytest.raises(TimeoutError):
                with bound:
                    await asyncio.sleep(10)
        bound.close()
        return bound.checks

    for timeout_s in (0.0123, 0.05, 0.0505):
        assert uvloop.run(expiries(timeout_s)) == 10
