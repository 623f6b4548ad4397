"""Every money rule of the storage interface, on every backend."""

from __future__ import annotations

import asyncio
import itertools

import msgspec
import pytest

from model_gateway.storage import (
    LimitReached,
    ProjectRecord,
    ReceiptRecord,
    RecordNotFound,
    ReservationRecord,
    StorageError,
    open_storage,
)
from model_gateway.storage.base import KeyRecord

MONTH = "2026-11"
_ids = itertools.count()


@pytest.fixture
async def storage(storage_url):
    """Each backend in turn (tests/storage/backends.py)."""
    backend = await open_storage(storage_url)
    yield backend
    await backend.close()


async def project(storage, *, credit=0, budget=None, limit=None) -> tuple[str, str]:
    pid, kid = f"prj_{next(_ids)}", f"key_{next(_ids)}"
    await storage.create_project(ProjectRecord(id=pid, name="t", monthly_budget=budget))
    await storage.create_key(
        KeyRecord(
            id=kid,
            prefix=f"proj_live_{next(_ids):08d}",
            key_hash=b"h",
            project_id=pid,
            scopes=frozenset({"inference"}),
            monthly_limit=limit,
        )
    )
    if credit:
        await storage.add_credit(pid, credit, MONTH)
    return pid, kid


def hold(pid, kid, amount, owner="test:1:1", lease_until=2**40) -> ReservationRecord:
    return ReservationRecord(
        id=f"rsv_{next(_ids)}",
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
        id=f"rcpt_{next(_ids)}",
        reservation_id=r.id,
        project_id=r.project_id,
        key_id=r.key_id,
        request_id="req_t",
        kind="inference",
        endpoint="/v1/chat/completions",
        model_or_runtime="echo-1",
        status="succeeded",
        usage={"input_tokens": 1},
        cost=cost,
        month=MONTH,
        created_at=1,
        request_sha256="a" * 64,
        response_sha256="b" * 64,
    )


async def refused(storage, reservation) -> str | None:
    try:
        await storage.reserve(reservation)
    except LimitReached as exc:
        return exc.reason
    return None


async def test_available_balance_counts_open_holds(storage):
    pid, kid = await project(storage, credit=100)
    assert await refused(storage, hold(pid, kid, 60)) is None
    assert await refused(storage, hold(pid, kid, 60)) == "insufficient_balance"
    assert await refused(storage, hold(pid, kid, 40)) is None


@pytest.mark.parametrize("limit", ["budget", "limit"], ids=["project-budget", "key-limit"])
async def test_a_monthly_cap_counts_spend_and_holds(storage, limit):
    pid, kid = await project(storage, credit=10_000, **{limit: 100})
    first = hold(pid, kid, 70)
    await storage.reserve(first)
    assert await refused(storage, hold(pid, kid, 31)) == "budget_exceeded"
    assert await storage.settle(receipt(first, 50))
    assert await storage.key_month_spend(kid, MONTH) == 50
    assert (await storage.project_account(pid, MONTH)).month_spend == 50
    assert await refused(storage, hold(pid, kid, 51)) == "budget_exceeded"
    assert await refused(storage, hold(pid, kid, 50)) is None


async def test_settlement_charges_once_and_frees_the_hold(storage):
    pid, kid = await project(storage, credit=1_000)
    r = hold(pid, kid, 300)
    await storage.reserve(r)
    assert await storage.settle(receipt(r, 120))
    assert not await storage.settle(receipt(r, 120))  # the hold is consumed: never twice
    account = await storage.project_account(pid, MONTH)
    assert (account.balance, account.reserved, account.month_spend) == (880, 0, 120)


async def test_settlement_never_charges_above_the_hold(storage):
    pid, kid = await project(storage, credit=1_000)
    r = hold(pid, kid, 100)
    await storage.reserve(r)
    assert not await storage.settle(receipt(r, 101))
    assert (await storage.project_account(pid, MONTH)).balance == 1_000


async def test_release_frees_without_charging(storage):
    pid, kid = await project(storage, credit=1_000)
    r = hold(pid, kid, 400)
    await storage.reserve(r)
    await storage.release(r.id)
    await storage.release(r.id)  # releasing twice is harmless
    audit = await storage.audit(pid, MONTH)
    assert (audit.balance, audit.reserved, audit.ledger_sum) == (1_000, 0, 1_000)
    assert not await storage.settle(receipt(r, 10))


async def test_abandoned_holds_are_released(storage):
    pid, kid = await project(storage, credit=1_000)
    dead, live, expired = (
        hold(pid, kid, 100, "h:1:dead"),
        hold(pid, kid, 100, "h:2:live"),
        hold(pid, kid, 100, "elsewhere:3:x", lease_until=1),
    )
    for r in (dead, live, expired):
        await storage.reserve(r)
    alive = {"h:1:dead": False, "h:2:live": True, "elsewhere:3:x": None}
    assert await storage.release_abandoned(alive.get) == 2
    assert (await storage.project_account(pid, MONTH)).reserved == 100
    await storage.renew_leases("h:2:live", 5)
    assert await storage.release_abandoned(lambda owner: True) == 1  # its lease ran out


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
async def test_receipt_round_trips(storage, status):
    pid, kid = await project(storage, credit=1_000)
    r = hold(pid, kid, 100)
    await storage.reserve(r)
    issued = msgspec.structs.replace(receipt(r, 42), status=status)
    assert await storage.settle(issued)
    assert await storage.get_receipt(issued.id) == issued
    assert await storage.get_receipt("rcpt_missing") is None


async def test_unknown_records_in_money_calls(storage):
    with pytest.raises(RecordNotFound):
        await storage.add_credit("prj_missing", 10, MONTH)
    with pytest.raises(RecordNotFound):
        await storage.project_account("prj_missing", MONTH)
    with pytest.raises(RecordNotFound):
        await storage.audit("prj_missing", MONTH)
    assert await storage.key_month_spend("key_missing", MONTH) == 0
    with pytest.raises(StorageError):
        await storage.reserve(hold("prj_missing", None, 1))


async def test_a_negative_credit_is_refused(storage):
    pid, _ = await project(storage, credit=100)
    with pytest.raises(StorageError):
        await storage.add_credit(pid, -50, MONTH)
    assert (await storage.audit(pid, MONTH)).balance == 100


async def test_a_receipt_settles_only_its_own_projects_hold(storage):
    pid, kid = await project(storage, credit=1_000)
    other, _ = await project(storage, credit=1_000)
    r = hold(pid, kid, 100)
    await storage.reserve(r)
    stray = receipt(r, 10)
    stray.project_id = other
    assert not await storage.settle(stray)
    assert (await storage.project_account(pid, MONTH)).reserved == 100
    assert (await storage.project_account(other, MONTH)).balance == 1_000


async def test_a_receipt_id_is_used_once(storage):
    pid, kid = await project(storage, credit=1_000)
    first, second = hold(pid, kid, 100), hold(pid, kid, 100)
    await storage.reserve(first)
    await storage.reserve(second)
    issued = receipt(first, 30)
    assert await storage.settle(issued)
    again = receipt(second, 30)
    again.id = issued.id
    with pytest.raises(StorageError):
        await storage.settle(again)
    # Nothing of the refused settlement was written: its hold is still open.
    audit = await storage.audit(pid, MONTH)
    assert (audit.balance, audit.reserved, audit.month_spend) == (970, 100, 30)


async def test_concurrent_writes_keep_their_own_outcomes(storage):
    """Concurrent holds and receipts share a batch (SQLite's group commit, PostgreSQL's
    batch functions): each is admitted, refused or fails as it would alone."""
    pid, kid = await project(storage, credit=600)
    holds = [hold(pid, kid, 100) for _ in range(8)]
    stray = hold("prj_missing", None, 1)  # its project does not exist
    outcomes = await asyncio.gather(
        *(refused(storage, h) for h in holds), storage.reserve(stray), return_exceptions=True
    )
    assert sorted(map(str, outcomes[:8])) == ["None"] * 6 + ["insufficient_balance"] * 2
    # Its own error alone (the backends name a missing row differently).
    assert isinstance(outcomes[8], StorageError) and not isinstance(outcomes[8], LimitReached)
    held = [h for h, outcome in zip(holds, outcomes, strict=False) if outcome is None]
    await storage.release(held[0].id)
    settled = await asyncio.gather(
        *(storage.settle(receipt(h, 40)) for h in held),
        storage.settle(receipt(held[1], 40)),  # its hold is consumed once
    )
    assert sorted(settled) == [False, False] + [True] * 5
    audit = await storage.audit(pid, MONTH)
    assert (audit.balance, audit.reserved, audit.month_spend) == (600 - 5 * 40, 0, 5 * 40)
    assert audit.balance == audit.ledger_sum
