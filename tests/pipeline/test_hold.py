"""The hold closes exactly once even when its task is cancelled the asyncio way
(`task.cancel()`, as dispatch does when a client disconnects), not only by anyio scopes."""

from __future__ import annotations

import asyncio

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
