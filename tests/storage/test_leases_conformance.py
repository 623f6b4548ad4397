"""Leases (migration 0012) on every backend: a lease is a hold of its owner process,
admitted, counted, swept and charged against under the rules of every hold."""

from __future__ import annotations

import secrets

import msgspec
import pytest

from model_gateway.storage import LimitReached, StorageError, open_storage
from tests.storage.test_metering_conformance import MONTH, hold, project, receipt, refused


@pytest.fixture
async def storage(fresh_storage_url):
    # A database of its own: sweeps are global, and holds leased for `[cluster] lease_s`
    # would expire under another test's sweep of the shared one.
    backend = await open_storage(fresh_storage_url)
    yield backend
    await backend.close()


def lease(pid, kid, amount, owner="test:1:1", lease_until=2**40):
    # An id of the meter's form: a receipt stores it packed (SQLite, migration 0011).
    record = hold(pid, kid, amount, owner, lease_until)
    return msgspec.structs.replace(record, id="rsv_" + secrets.token_hex(12))


async def granted(storage, record) -> str | None:
    try:
        await storage.grant_lease(record)
    except LimitReached as exc:
        return exc.reason
    return None


async def books(storage, pid) -> tuple[int, int, int, int]:
    """(balance, requests' holds, leased, month spend), checked against the rows."""
    audit = await storage.audit(pid, MONTH)
    assert audit.balance == audit.ledger_sum
    assert audit.reserved == audit.open_reservations_sum  # leases are holds too
    leased, leases_sum = await storage.lease_audit(pid)
    assert leased == leases_sum
    account = await storage.project_account(pid, MONTH)
    # What requests hold of leases moves from `leased` to `reserved`.
    assert 0 <= account.leased <= leased
    assert account.reserved + account.leased == audit.reserved
    return account.balance, account.reserved, account.leased, account.month_spend


async def test_a_lease_is_held_apart_from_requests_holds(storage):
    pid, kid = await project(storage, credit=1_000)
    await storage.reserve(hold(pid, kid, 100))
    await storage.grant_lease(lease(pid, kid, 600))
    assert await books(storage, pid) == (1_000, 100, 600, 0)
    # The lease's money is held: a direct hold sees only what is left.
    assert await refused(storage, hold(pid, kid, 301)) == "insufficient_balance"
    assert await refused(storage, hold(pid, kid, 300)) is None


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"credit": 100}, "insufficient_balance"),
        ({"credit": 10_000, "budget": 100}, "budget_exceeded"),
        ({"credit": 10_000, "limit": 100}, "budget_exceeded"),
    ],
    ids=["balance", "project-budget", "key-limit"],
)
async def test_a_lease_is_admitted_like_a_hold(storage, options, reason):
    pid, kid = await project(storage, **options)
    await storage.reserve(hold(pid, kid, 30))
    assert await granted(storage, lease(pid, kid, 71)) == reason
    assert await granted(storage, lease(pid, kid, 70)) is None
    assert await refused(storage, hold(pid, kid, 1)) == reason
    assert await books(storage, pid) == (options["credit"], 30, 70, 0)


async def test_receipts_charge_against_a_lease_until_it_is_spent(storage):
    pid, kid = await project(storage, credit=1_000)
    granted_lease = lease(pid, kid, 500)
    await storage.grant_lease(granted_lease)
    for cost in (200, 250):
        assert await storage.settle(receipt(granted_lease, cost))
    assert await books(storage, pid) == (550, 0, 50, 450)
    assert not await storage.settle(receipt(granted_lease, 51))  # never above what is left
    assert await storage.settle(receipt(granted_lease, 50))
    assert await books(storage, pid) == (500, 0, 0, 500)
    assert await storage.key_month_spend(kid, MONTH) == 500
    await storage.release(granted_lease.id)
    assert await books(storage, pid) == (500, 0, 0, 500)


async def test_a_lease_only_shrinks(storage):
    pid, kid = await project(storage, credit=1_000)
    granted_lease = lease(pid, kid, 500)
    await storage.grant_lease(granted_lease)
    assert await storage.return_lease(granted_lease.id, 200)
    assert not await storage.return_lease(granted_lease.id, 301)
    assert await books(storage, pid) == (1_000, 0, 300, 0)
    with pytest.raises(StorageError):
        await storage.return_lease(granted_lease.id, -1)  # growing it: refused
    direct = hold(pid, kid, 10)
    await storage.reserve(direct)
    assert not await storage.return_lease(direct.id, 1)  # a request's hold is no lease
    await storage.release(granted_lease.id)
    assert await books(storage, pid) == (1_000, 10, 0, 0)


async def test_a_dead_owners_leases_are_swept(storage):
    pid, kid = await project(storage, credit=1_000)
    await storage.grant_lease(lease(pid, kid, 300, owner="h:1:dead"))
    live = lease(pid, kid, 300, owner="h:2:live")
    await storage.grant_lease(live)
    await storage.grant_lease(lease(pid, kid, 300, owner="elsewhere:3:x", lease_until=1))
    alive = {"h:1:dead": False, "h:2:live": True, "elsewhere:3:x": None}
    assert await storage.release_abandoned(alive.get) == 2
    assert await books(storage, pid) == (1_000, 0, 300, 0)
    await storage.renew_leases("h:2:live", 5)
    assert await storage.release_abandoned(lambda owner: True) == 1
    assert await books(storage, pid) == (1_000, 0, 0, 0)
    assert not await storage.settle(receipt(live, 1))


async def test_a_recall_asks_the_other_owners(storage):
    pid, kid = await project(storage, credit=1_000)
    mine, theirs = lease(pid, kid, 100, owner="a:1:1"), lease(pid, kid, 100, owner="b:2:2")
    await storage.grant_lease(mine)
    await storage.grant_lease(theirs)
    assert await storage.recall_leases(pid, "a:1:1") == 1
    assert await storage.recall_leases(pid, "a:1:1") == 0  # asked already
    assert await storage.pending_recalls(pid, "a:1:1") == 1
    assert await storage.recalled_leases("b:2:2") == [theirs.id]
    assert await storage.recalled_leases("a:1:1") == []
    assert await storage.return_lease(theirs.id, 60)  # the answer
    assert await storage.pending_recalls(pid, "a:1:1") == 0
    assert await storage.recalled_leases("b:2:2") == []
    assert await books(storage, pid) == (1_000, 0, 140, 0)


async def test_a_lease_settles_only_its_own_projects_receipts(storage):
    pid, kid = await project(storage, credit=1_000)
    other, _ = await project(storage, credit=1_000)
    granted_lease = lease(pid, kid, 100)
    await storage.grant_lease(granted_lease)
    stray = msgspec.structs.replace(receipt(granted_lease, 10), project_id=other)
    assert not await storage.settle(stray)
    assert await books(storage, pid) == (1_000, 0, 100, 0)


async def test_what_requests_hold_of_a_lease_shows_as_reserved(storage):
    pid, kid = await project(storage, credit=1_000)
    await storage.reserve(hold(pid, kid, 100))
    granted_lease = lease(pid, kid, 600)
    await storage.grant_lease(granted_lease)
    await storage.mark_in_use([(granted_lease.id, 250)])
    assert await books(storage, pid) == (1_000, 350, 350, 0)
    # Admission still counts the lease whole, used or not.
    assert await refused(storage, hold(pid, kid, 301)) == "insufficient_balance"
    # Charged before its owner writes again: never more than what is left of the lease.
    assert await storage.settle(receipt(granted_lease, 500))
    assert await books(storage, pid) == (500, 200, 0, 500)
    await storage.mark_in_use([(granted_lease.id, 0)])
    assert await books(storage, pid) == (500, 100, 100, 500)
    await storage.release(granted_lease.id)
    await storage.mark_in_use([(granted_lease.id, 5)])  # gone: nothing to write
    direct = hold(pid, kid, 10)
    await storage.reserve(direct)
    await storage.mark_in_use([(direct.id, 5)])  # a request's own hold is no lease
    assert await books(storage, pid) == (500, 110, 0, 500)
