"""A request cancelled while its meter's write is in flight leaves the books right, on
every backend (the hold runs the call to its end in a task of its own)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from model_gateway.gateway.metering.storage_meter import StorageMeter, current_month
from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.hold import Hold
from model_gateway.storage import ProjectRecord, open_storage

_ids = itertools.count()


@pytest.fixture
async def meter(storage_url):
    storage = await open_storage(storage_url)
    yield StorageMeter(storage)
    await storage.close()


async def funded_project(meter: StorageMeter) -> str:
    pid = f"prj_{next(_ids):016x}"
    await meter.storage.create_project(ProjectRecord(id=pid, name="t"))
    await meter.storage.add_credit(pid, 1_000, current_month())
    return pid


def settlement(cost: int) -> Settlement:
    return Settlement(
        receipt_id=f"rcpt_{next(_ids):028x}", request_id=f"req_{next(_ids):024x}",
        kind="inference", endpoint="/v1/chat/completions", subject="echo-1",
        status="succeeded", usage={"input_tokens": 1, "output_tokens": 1}, cost=cost,
        request_body=b"{}", response_sha256=None,
    )  # fmt: skip


async def test_a_take_cancelled_while_its_write_is_in_flight_holds_nothing(meter):
    pid = await funded_project(meter)
    task = asyncio.create_task(Hold.take(meter, pid, None, 600))
    await asyncio.sleep(0)  # the hold's write is queued, not yet committed
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    account = await meter.storage.project_account(pid, current_month())
    assert (account.balance, account.reserved) == (1_000, 0)


async def test_a_settle_cancelled_while_its_write_is_in_flight_is_charged_once(meter):
    pid = await funded_project(meter)
    hold = await Hold.take(meter, pid, None, 600)
    charged = settlement(250)
    task = asyncio.create_task(hold.settle(charged))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await hold.release()  # the owner's finally: the hold is settled, nothing to free
    account = await meter.storage.project_account(pid, current_month())
    assert (account.balance, account.reserved) == (750, 0)
    assert (await meter.storage.get_receipt(charged.receipt_id)).cost == 250
