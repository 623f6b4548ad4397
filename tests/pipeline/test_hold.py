"""The hold closes exactly once even when its task is cancelled the asyncio way
(`task.cancel()`, as dispatch does when a client disconnects), not only by anyio scopes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import anyio
import pytest

from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.hold import Hold
from model_gateway.pipeline.memory import MemoryMeter, Project
from model_gateway.pipeline.ports import Reserved


class SlowMeter(MemoryMeter):
    """The memory meter, with storage's latency: each write waits before it applies."""

    async def settle(self, reservation: Reserved, settlement: Settlement) -> None:
        await asyncio.sleep(0.05)
        await super().settle(reservation, settlement)

    async def release(self, reservation: Reserved) -> None:
        await asyncio.sleep(0.05)
        await super().release(reservation)


def settlement(cost: int) -> Settlement:
    return Settlement(
        receipt_id="rcpt_1", request_id="req_1", kind="inference", endpoint="/v1/x",
        subject="m", status="succeeded", usage={}, cost=cost, request_body=b"",
        response_sha256=None,
    )  # fmt: skip


@pytest.fixture
def meter() -> SlowMeter:
    return SlowMeter({"p": Project("p", balance=1_000)}, {})


async def test_a_settle_cancelled_midway_still_completes_then_the_cancel_goes_on(meter):
    hold = await Hold.take(meter, "p", None, 600)
    task = asyncio.create_task(hold.settle(settlement(400)))
    await asyncio.sleep(0.01)  # inside the meter's write
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert hold.state == "settled" and meter.receipts == [settlement(400)]
    assert meter.projects["p"].balance == 600 and meter.reserved("p") == 0
    await hold.release()  # the owner's finally: nothing more happens
    assert meter.projects["p"].balance == 600


async def test_a_release_cancelled_midway_still_frees_the_money(meter):
    hold = await Hold.take(meter, "p", None, 600)
    task = asyncio.create_task(hold.release())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert hold.state == "released" and meter.reserved("p") == 0


async def test_a_take_cancelled_while_the_meter_writes_releases_what_it_reserved(meter):
    class SlowReserve(type(meter)):
        async def reserve(self, project_id, key_id, amount, *, watched=False):
            await asyncio.sleep(0.05)
            return await super().reserve(project_id, key_id, amount)

    meter.__class__ = SlowReserve
    task = asyncio.create_task(Hold.take(meter, "p", None, 600))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert meter.reserved("p") == 0 and meter.projects["p"].balance == 1_000


async def test_an_anyio_scope_cancelled_again_and_again_still_lets_the_settle_end(meter):
    # anyio cancels the task at every turn while its scope is cancelled, not once.
    hold = await Hold.take(meter, "p", None, 600)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await hold.settle(settlement(250))
    assert scope.cancelled_caught
    assert hold.state == "settled" and meter.projects["p"].balance == 750


async def test_the_meters_own_errors_reach_it_where_it_awaits(meter):
    """A failed future is raised inside the meter's call, which may handle it."""

    class Translating(type(meter)):
        async def release(self, reservation):
            failed = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(0.01, failed.set_exception, OSError("disk"))
            try:
                await failed
            except OSError as exc:
                raise RuntimeError(f"storage: {exc}") from exc

    meter.__class__ = Translating
    hold = await Hold.take(meter, "p", None, 600)
    with pytest.raises(RuntimeError, match="storage: disk"):
        await hold.release()


async def test_a_bare_yield_in_the_meter_gives_the_loop_a_turn(meter):
    ran: list[str] = []

    class Yielding(type(meter)):
        async def reserve(self, project_id, key_id, amount, *, watched=False):
            await asyncio.sleep(0)  # a bare yield to the loop
            ran.append("meter")
            return await super().reserve(project_id, key_id, amount)

    meter.__class__ = Yielding
    asyncio.get_running_loop().call_soon(ran.append, "loop")
    hold = await Hold.take(meter, "p", None, 600)
    assert ran == ["loop", "meter"] and hold.amount == 600


async def test_a_settle_that_raised_is_never_tried_again_and_the_release_frees_the_money(meter):
    """Its receipt may have been stored or offered to the log: a second settle would make
    another (fresh salts, another time) under the same id."""
    tries = []

    class FailingOnce(type(meter)):
        async def settle(self, reservation, settlement):
            tries.append(settlement.cost)
            if len(tries) == 1:
                raise OSError("commit outcome unknown")
            await super().settle(reservation, settlement)

    meter.__class__ = FailingOnce
    hold = await Hold.take(meter, "p", None, 600)
    with pytest.raises(OSError):
        await hold.settle(settlement(400))
    assert hold.state == "failed"
    await hold.settle(settlement(400))  # a no-op
    assert tries == [400] and meter.receipts == []
    await hold.release()
    assert hold.state == "released" and meter.reserved("p") == 0
    assert meter.projects["p"].balance == 1_000


async def test_a_wait_cancelled_again_and_again_leaves_no_callbacks_behind(meter):
    """Each cancel takes its wake-up off the future the meter awaits, as asyncio.shield
    does: anyio cancels at every loop turn, and a write may wait seconds (a busy database),
    so wake-ups left behind would pile up by the thousand until it ends."""
    loop = asyncio.get_running_loop()
    written = loop.create_future()
    most = 0

    def watch() -> None:
        nonlocal most
        most = max(most, len(written._callbacks or ()))
        if not written.done():
            loop.call_soon(watch)

    class Waiting(type(meter)):
        async def settle(self, reservation, settlement):
            await written
            await super().settle(reservation, settlement)

    meter.__class__ = Waiting
    hold = await Hold.take(meter, "p", None, 600)
    loop.call_soon(watch)
    loop.call_later(0.05, written.set_result, None)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await hold.settle(settlement(250))
    assert hold.state == "settled" and meter.projects["p"].balance == 750
    assert 1 <= most <= 2


async def cancelled_midway(call: Awaitable[object]) -> BaseException:
    """Await `call` in a task, cancel the task 10 ms in (inside the meter's call, whose
    writes take 50), check that it ends cancelled, and return what `call` raised."""
    raised: list[BaseException] = []

    async def calling() -> None:
        try:
            await call
        except BaseException as exc:
            raised.append(exc)
            raise

    task = asyncio.create_task(calling())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    return raised[0]


class FailingLate(SlowMeter):
    """A settle that fails once the caller's cancel has come: its write's outcome unknown."""

    async def settle(self, reservation: Reserved, settlement: Settlement) -> None:
        await asyncio.sleep(0.05)
        raise OSError("commit outcome unknown")


async def test_a_cancel_that_came_before_the_meter_failed_is_what_the_task_ends_with(meter):
    """The cancel wins over the failure, as for a task cancelled while it awaits a future:
    the task ends cancelled (dispatch, when a client disconnects, counts on it), the failure
    is the cancel's context, and the hold is left to its release."""
    meter.__class__ = FailingLate
    hold = await Hold.take(meter, "p", None, 600)
    raised = await cancelled_midway(hold.settle(settlement(400)))
    assert isinstance(raised, asyncio.CancelledError) and isinstance(raised.__context__, OSError)
    assert hold.state == "failed"
    await hold.release()
    assert hold.state == "released" and meter.reserved("p") == 0
    assert meter.projects["p"].balance == 1_000


async def test_an_anyio_scope_cancelled_while_the_meter_fails_catches_its_own_cancel(meter):
    meter.__class__ = FailingLate
    hold = await Hold.take(meter, "p", None, 600)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await hold.settle(settlement(400))
    assert scope.cancelled_caught and hold.state == "failed"
    await hold.release()
    assert meter.reserved("p") == 0 and meter.projects["p"].balance == 1_000


async def test_a_take_whose_release_fails_after_a_cancel_still_ends_cancelled(meter):
    """Cancelled while reserving, the take releases what it reserved; when that release
    fails, the cancel is still what the task ends with, the failure its context."""

    class SlowReserveFailingRelease(type(meter)):
        async def reserve(self, project_id, key_id, amount, *, watched=False):
            await asyncio.sleep(0.05)
            return await super().reserve(project_id, key_id, amount)

        async def release(self, reservation):
            raise OSError("release outcome unknown")

    meter.__class__ = SlowReserveFailingRelease
    raised = await cancelled_midway(Hold.take(meter, "p", None, 600))
    assert isinstance(raised, asyncio.CancelledError) and isinstance(raised.__context__, OSError)


class Fatal(BaseException):
    """Neither a failure nor a cancel: what KeyboardInterrupt and SystemExit are."""


async def test_what_is_not_a_failure_goes_on_even_after_a_cancel(meter):
    class Exiting(type(meter)):
        async def settle(self, reservation, settlement):
            await asyncio.sleep(0.05)
            raise Fatal

    meter.__class__ = Exiting
    hold = await Hold.take(meter, "p", None, 600)
    task = asyncio.create_task(hold.settle(settlement(400)))
    await asyncio.sleep(0.01)  # inside the meter's write
    task.cancel()
    with pytest.raises(Fatal):
        await task
    assert hold.state == "failed"


async def test_a_call_suspended_in_a_closed_coroutine_lets_the_close_through(meter):
    """Closing the caller's coroutine (a loop torn down) throws GeneratorExit where it
    waits: it must go through, not be taken for the work's outcome and waited past."""
    hold = await Hold.take(meter, "p", None, 600)
    settling = hold.settle(settlement(400))
    settling.send(None)  # suspended inside the meter's write
    settling.close()  # raises RuntimeError if the GeneratorExit was swallowed
    await asyncio.sleep(0.1)  # the write, in a task of its own or abandoned, ends first
