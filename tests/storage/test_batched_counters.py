"""Concurrent holds and receipts move every counter as one after the other would, whether
their batch fits whole (PostgreSQL then moves each project's and key's counters once,
migration 0020) or not (row by row)."""

from __future__ import annotations

import asyncio

from tests.storage.test_metering_conformance import MONTH, hold, project, receipt, refused
from tests.storage.test_metering_conformance import storage as storage  # the fixture


async def _figures(storage, pid, kid) -> tuple[int | None, ...]:
    f = await storage.limit_figures(pid, kid, MONTH)
    return f["balance"], f["reserved"], f["month_spend"], f["key_reserved"], f["key_month_spend"]


async def test_batches_that_fit_whole_move_each_project_and_key_by_their_sums(storage):
    (a, a1), (b, b1) = (
        await project(storage, credit=10_000, budget=1_000, limit=500),
        await project(storage, credit=10_000),
    )
    holds = [hold(a, a1, 100) for _ in range(4)] + [hold(b, b1, 50) for _ in range(3)]
    holds.append(hold(a, None, 70))  # a hold without a key
    assert await asyncio.gather(*(storage.reserve(h) for h in holds)) == [None] * 8
    assert await _figures(storage, a, a1) == (10_000, 470, 0, 400, 0)
    assert await _figures(storage, b, b1) == (10_000, 150, 0, 150, 0)

    settled = await asyncio.gather(*(storage.settle(receipt(h, 30)) for h in holds))
    assert settled == [True] * 8
    assert await _figures(storage, a, a1) == (10_000 - 150, 0, 150, 0, 120)
    assert await _figures(storage, b, b1) == (10_000 - 90, 0, 90, 0, 90)
    for pid in (a, b):
        audit = await storage.audit(pid, MONTH)
        assert audit.balance == audit.ledger_sum and audit.reserved == 0


async def test_a_batch_past_a_limit_admits_what_one_after_the_other_would(storage):
    pid, kid = await project(storage, credit=10_000, limit=500)
    first = [hold(pid, kid, 100) for _ in range(3)]
    assert await asyncio.gather(*(storage.reserve(h) for h in first)) == [None] * 3
    assert await asyncio.gather(*(storage.settle(receipt(h, 80)) for h in first)) == [True] * 3
    # 240 spent: 260 left under the key's limit, two holds of 100.
    outcomes = await asyncio.gather(*(refused(storage, hold(pid, kid, 100)) for _ in range(4)))
    assert sorted(map(str, outcomes)) == ["None", "None", "budget_exceeded", "budget_exceeded"]
    assert await _figures(storage, pid, kid) == (10_000 - 240, 200, 240, 200, 240)
