"""Many writers at once through two separate handles (two connection pools on PostgreSQL,
as two gateway processes have): the money rules hold exactly, on every backend."""

from __future__ import annotations

import asyncio
import itertools
import random
import sys

import pytest

from model_gateway.storage import (
    LimitReached,
    ProjectRecord,
    ReceiptRecord,
    ReservationRecord,
    Storage,
    open_storage,
)
from model_gateway.storage.base import KeyRecord, new_id

MONTH = "2026-11"
HOLD = 100
_n = itertools.count()


@pytest.fixture
async def pools(storage_url):
    """Two handles on one database, each with its own connections."""
    first = await open_storage(storage_url)
    second = await open_storage(storage_url)
    yield first, second
    await first.close()
    await second.close()


async def account(storage: Storage, *, credit: int, budget=None, limit=None) -> tuple[str, str]:
    pid, kid = new_id("prj"), new_id("key")
    await storage.create_project(ProjectRecord(id=pid, name="race", monthly_budget=budget))
    await storage.create_key(
        KeyRecord(
            id=kid,
            prefix=f"proj_live_c{next(_n):08d}",
            key_hash=b"h",
            project_id=pid,
            scopes=frozenset({"inference"}),
            monthly_limit=limit,
        )
    )
    await storage.add_credit(pid, credit, MONTH)
    return pid, kid


def hold(pid: str, kid: str, amount: int, owner: str = "race:1:1", lease_until: int = 2**40):
    return ReservationRecord(
        id=new_id("rsv"),
        project_id=pid,
        key_id=kid,
        amount=amount,
        month=MONTH,
        owner=owner,
        lease_until=lease_until,
        created_at=0,
    )


def receipt(r: ReservationRecord, cost: int) -> ReceiptRecord:
    return ReceiptRecord(
        id=new_id("rcpt"),
        reservation_id=r.id,
        project_id=r.project_id,
        key_id=r.key_id,
        request_id="req_race",
        kind="inference",
        endpoint="/v1/chat/completions",
        model_or_runtime="echo-1",
        status="succeeded",
        usage={"output_tokens": cost},
        cost=cost,
        month=MONTH,
        created_at=1,
        request_sha256="0" * 64,
        response_sha256="0" * 64,
    )


async def try_reserve(storage: Storage, r: ReservationRecord) -> str | None:
    try:
        await storage.reserve(r)
    except LimitReached as refused:
        return refused.reason
    return None


async def books_balance(storage: Storage, pid: str, kid: str, credit: int, charged: int) -> None:
    audit = await storage.audit(pid, MONTH)
    assert audit.reserved == audit.open_reservations_sum == 0
    assert audit.balance == audit.ledger_sum == credit - charged
    assert audit.month_spend == audit.month_charges_sum == charged
    assert await storage.key_month_spend(kid, MONTH) == charged


@pytest.mark.parametrize(
    ("money", "refusal"),
    [
        ({"credit": 10 * HOLD + HOLD // 2}, "insufficient_balance"),
        ({"credit": 10**9, "budget": 10 * HOLD + HOLD // 2}, "budget_exceeded"),
        ({"credit": 10**9, "limit": 10 * HOLD + HOLD // 2}, "budget_exceeded"),
    ],
    ids=["balance", "project-budget", "key-monthly-limit"],
)
async def test_two_pools_racing_for_a_small_balance_admit_exactly_what_it_covers(
    pools, money, refusal
):
    first, second = pools
    pid, kid = await account(first, **money)
    holds = [hold(pid, kid, HOLD) for _ in range(200)]
    outcomes = await asyncio.gather(*(try_reserve(pools[i % 2], r) for i, r in enumerate(holds)))
    admitted = [r for r, outcome in zip(holds, outcomes, strict=True) if outcome is None]
    # Never over, and never refused while the money covered it: exactly ten fit.
    assert len(admitted) == 10
    assert set(outcomes) == {None, refusal}
    assert (await second.project_account(pid, MONTH)).reserved == 10 * HOLD

    # Each hold settled twice at once, once through each pool: charged exactly once.
    costs = {r.id: random.randint(0, HOLD) for r in admitted}
    settled = await asyncio.gather(
        *(pool.settle(receipt(r, costs[r.id])) for r in admitted for pool in (first, second))
    )
    assert sum(settled) == len(admitted)
    await books_balance(second, pid, kid, money["credit"], sum(costs.values()))


async def test_reserve_settle_and_release_interleaved_never_go_over(pools):
    """Workers on both pools reserve, settle or release as they go; a reader samples the
    account meanwhile: available money and the budget are never exceeded at any moment."""
    first, second = pools
    credit, budget = 5_000, 4_000
    pid, kid = await account(first, credit=credit, budget=budget)
    charged: list[int] = []
    samples: list[tuple[int, int, int]] = []
    done = asyncio.Event()

    async def worker(storage: Storage, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            r = hold(pid, kid, rng.randint(1, 400))
            if await try_reserve(storage, r) is not None:
                continue
            await asyncio.sleep(0)
            if rng.random() < 0.7:
                cost = rng.randint(0, r.amount)
                if await rng.choice((first, second)).settle(receipt(r, cost)):
                    charged.append(cost)
            else:
                await rng.choice((first, second)).release(r.id)

    async def sampler() -> None:
        while not done.is_set():
            a = await second.project_account(pid, MONTH)
            samples.append((a.balance, a.reserved, a.month_spend))
            await asyncio.sleep(0)

    watching = asyncio.create_task(sampler())
    await asyncio.gather(*(worker(pools[i % 2], i) for i in range(16)))
    done.set()
    await watching

    assert samples and charged
    for balance, reserved, month_spend in samples:
        assert balance - reserved >= 0
        assert month_spend + reserved <= budget
    assert sum(charged) <= budget
    await books_balance(first, pid, kid, credit, sum(charged))


async def test_two_sweepers_release_each_abandoned_hold_exactly_once(pools):
    first, second = pools
    pid, kid = await account(first, credit=10**6)
    dead = f"gone:{next(_n)}:x"
    holds = [hold(pid, kid, 10, owner=dead) for _ in range(40)]
    holds += [hold(pid, kid, 10, owner=f"lapsed:{next(_n)}:x", lease_until=1) for _ in range(40)]
    await asyncio.gather(*(pools[i % 2].reserve(r) for i, r in enumerate(holds)))
    # Half of the dead owner's holds are settled while both sweepers run.
    settling = holds[:20]

    def alive(owner: str) -> bool | None:
        return False if owner == dead else None

    results = await asyncio.gather(
        first.release_abandoned(alive),
        second.release_abandoned(alive),
        *(pools[i % 2].settle(receipt(r, 5)) for i, r in enumerate(settling)),
    )
    released, settled = results[0] + results[1], sum(results[2:])
    assert released + settled == len(holds)
    await books_balance(second, pid, kid, 10**6, 5 * settled)


_RACER = """
import asyncio, sys
from model_gateway.storage import LimitReached, ReservationRecord, open_storage

url, pid, kid, n, name = sys.argv[1:]

async def one(storage, i):
    hold = ReservationRecord(
        id=f"rsv_{name}_{i}", project_id=pid, key_id=kid, amount=100, month="2026-11",
        owner=f"racer:{name}:1", lease_until=2**40, created_at=0,
    )
    try:
        await storage.reserve(hold)
        return 1
    except LimitReached:
        return 0

async def main():
    storage = await open_storage(url)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    admitted = sum(await asyncio.gather(*(one(storage, i) for i in range(int(n)))))
    await storage.close()
    print(admitted, flush=True)

asyncio.run(main())
"""


async def test_two_processes_racing_for_a_small_balance_admit_exactly_what_it_covers(storage_url):
    """As two gateway instances: separate processes, separate pools, one project."""
    storage = await open_storage(storage_url)
    try:
        pid, kid = await account(storage, credit=10 * HOLD + HOLD // 2)
        racers = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _RACER,
                storage_url,
                pid,
                kid,
                "100",
                str(n),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            for n in range(2)
        ]
        for racer in racers:  # both have opened their pools: start them together
            assert await racer.stdout.readline() == b"ready\n"
        for racer in racers:
            racer.stdin.write(b"go\n")
            await racer.stdin.drain()
        outputs = [await racer.communicate() for racer in racers]
        assert all(racer.returncode == 0 for racer in racers)
        admitted = [int(out.strip()) for out, _ in outputs]
        assert sum(admitted) == 10
        audit = await storage.audit(pid, MONTH)
        assert audit.reserved == audit.open_reservations_sum == 10 * HOLD
        assert audit.balance == audit.ledger_sum == 10 * HOLD + HOLD // 2
    finally:
        await storage.close()


async def test_settlements_and_releases_racing_for_one_hold_charge_it_at_most_once(pools):
    """Per hold, two settlements (one per pool) and a release race: at most one settle
    returns True, a loser returns False (the locking EXISTS finds the hold gone) instead
    of raising, and the books equal exactly the winners' costs."""
    first, second = pools
    credit = 10_000
    pid, kid = await account(first, credit=credit)
    charged = 0
    for n in range(30):
        r = hold(pid, kid, 100)
        await first.reserve(r)
        outcomes = await asyncio.gather(
            first.settle(receipt(r, 10 + n % 7)),
            second.settle(receipt(r, 10 + n % 7)),
            (first if n % 2 else second).release(r.id),
        )
        assert sum(o is True for o in outcomes[:2]) <= 1
        assert all(isinstance(o, bool) for o in outcomes[:2])
        charged += (10 + n % 7) * sum(o is True for o in outcomes[:2])
    await books_balance(first, pid, kid, credit, charged)
