"""The `LeasedMeter`'s own rules over a real database of every backend: which requests
hold directly, what goes back and when."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from model_gateway.gateway.cluster.instance import Instance
from model_gateway.gateway.metering.leased_meter import (
    SLICE_HOLDS,
    LeasedMeter,
    LeaseHold,
)
from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.gateway.ops.metrics import Metrics
from model_gateway.pipeline.errors import BudgetExceeded, InsufficientBalance, ServiceUnavailable
from model_gateway.storage import ProjectRecord, StorageError, open_storage
from model_gateway.storage.base import KeyRecord, ReservationRecord, new_id
from model_gateway.storage.sqlite import SQLiteStorage
from tests.metering.test_leases_state_machine import settlement


@pytest.fixture
async def storage(fresh_storage_url):
    # A database of its own: sweeps are global, and holds leased for `[cluster] lease_s`
    # would expire under another test's sweep of the shared one.
    backend = await open_storage(fresh_storage_url)
    yield backend
    await backend.close()


async def funded(storage, credit: int, **key_options) -> tuple[str, str]:
    pid, kid = new_id("prj"), new_id("key")
    await storage.create_project(ProjectRecord(id=pid, name="m"))
    key = KeyRecord(
        id=kid, prefix=f"proj_live_{kid[-8:]}", key_hash=b"h", project_id=pid,
        scopes=frozenset({"inference"}), **key_options,
    )  # fmt: skip
    await storage.create_key(key)
    await storage.add_credit(pid, credit, current_month())
    return pid, kid


async def test_requests_share_a_lease_and_settle_against_it(storage):
    pid, kid = await funded(storage, 1_000_000)
    meter = LeasedMeter(storage)
    holds = [await meter.reserve(pid, kid, 100) for _ in range(SLICE_HOLDS)]
    assert all(isinstance(h, LeaseHold) for h in holds)
    assert len({h.lease for h in holds}) == 1  # one grant for the slice
    for hold in holds:
        await meter.settle(hold, settlement(40))
    account = await storage.project_account(pid, current_month())
    assert (account.balance, account.reserved) == (1_000_000 - 40 * SLICE_HOLDS, 0)
    assert account.leased == SLICE_HOLDS * 100 - 40 * SLICE_HOLDS
    await meter.stop()  # shutdown gives the leases back
    assert (await storage.project_account(pid, current_month())).leased == 0


async def test_the_last_money_is_held_directly(storage):
    pid, kid = await funded(storage, 150)
    meter = LeasedMeter(storage)
    # Half of what is left (75) does not cover a hold of 100: no lease.
    assert isinstance(await meter.reserve(pid, kid, 100), ReservationRecord)
    assert (await storage.project_account(pid, current_month())).leased == 0


async def test_a_fenced_instance_takes_no_hold_from_its_leases(storage):
    """An instance that lost its registry lease may be swept by the others: its leases
    serve nothing more, although they still have room in this process."""
    pid, kid = await funded(storage, 1_000_000)
    instance = Instance(storage, "leases-fence-test:1:1", lease_s=0.5)
    await instance.start()
    meter = LeasedMeter(storage, owner=instance.id, lease_s=0.5, instance=instance)
    hold = await meter.reserve(pid, kid, 100)
    assert isinstance(hold, LeaseHold) and hold.lease.free >= 100
    await instance.stop()  # no more renewals: fenced once its lease has run out
    await asyncio.sleep(0.6)
    with pytest.raises(ServiceUnavailable):
        await meter.reserve(pid, kid, 100)
    assert hold.lease.held == 100  # nothing more taken from the lease
    await meter.release(hold)
    await meter.stop()  # its lease goes back: no short-lived row left for other tests


async def test_keyless_holds_are_direct(storage):
    """Hosted agents' steps: their run tracks the hold by its id in the database."""
    pid, _ = await funded(storage, 1_000_000)
    assert isinstance(await LeasedMeter(storage).reserve(pid, None, 100), ReservationRecord)


async def test_holds_are_direct_while_writes_are_queued(storage):
    """Under load a direct hold shares its batch's commit; idle, it would commit alone,
    and a lease saves that commit."""
    pid, kid = await funded(storage, 1_000_000)
    meter = LeasedMeter(storage)
    assert storage.writes_idle()
    assert isinstance(await meter.reserve(pid, kid, 100), LeaseHold)
    other = ReservationRecord(
        id=new_id("rsv"), project_id=pid, key_id=None, amount=5, month=current_month(),
        owner=meter.owner, lease_until=2**40, created_at=0,
    )  # fmt: skip
    queued = asyncio.create_task(storage.reserve(other))  # another request's hold
    await asyncio.sleep(0)  # it waits for the next batch now
    assert not storage.writes_idle()
    busy = await meter.reserve(pid, kid, 100)
    assert isinstance(busy, ReservationRecord)  # a direct hold, in that batch
    await queued
    assert storage.writes_idle()
    assert isinstance(await meter.reserve(pid, kid, 100), LeaseHold)
    await meter.release(busy)
    await storage.release(other.id)
    await meter.stop()


async def test_an_admin_change_retires_the_leases(storage):
    pid, kid = await funded(storage, 1_000_000)
    meter = LeasedMeter(storage)
    first = await meter.reserve(pid, kid, 100)
    assert isinstance(first, LeaseHold)
    await storage.update_key(f"proj_live_{kid[-8:]}", {"monthly_limit": 150})
    await storage.checkpoint()  # PostgreSQL: the notification has arrived by now
    while storage.admin_epoch() == meter._epoch:
        await storage.health()
    # The new limit applies to the next hold at once: 100 held on the lease + 100 > 150.
    second = meter.reserve(pid, kid, 100)
    with pytest.raises(BudgetExceeded, match="monthly limit"):
        await second
    await meter.release(first)
    await meter.keep()  # the retired lease, without holds, ends
    assert (await storage.project_account(pid, current_month())).leased == 0


async def test_quiet_slots_are_forgotten(storage):
    pid, kid = await funded(storage, 1_000_000)
    meter = LeasedMeter(storage, idle_s=0)
    await meter.release(await meter.reserve(pid, kid, 100))
    await meter.keep()  # idle: given back
    assert not meter.slots
    for demand in meter._demand.values():
        demand.started -= 10
    await meter.keep()
    assert not meter._demand and not meter._growing


async def test_a_settlement_that_fails_retires_its_lease(tmp_path):
    """Committed or not, the meter cannot tell: the lease takes no new hold, so that its
    other requests stay covered whatever the database did; the failed hold stays open."""
    path = tmp_path / "busy.db"
    storage = await SQLiteStorage.open(f"sqlite:///{path}", busy_timeout_s=0.2)
    try:
        pid, kid = await funded(storage, 1_000_000)
        meter = LeasedMeter(storage)
        first, second = await meter.reserve(pid, kid, 100), await meter.reserve(pid, kid, 100)
        assert isinstance(first, LeaseHold) and first.lease is second.lease
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StorageError):
            await meter.settle(first, settlement(50))
        locker.execute("ROLLBACK")
        locker.close()
        assert first.lease.retired and first.lease.held == 200
        await meter.release(first)
        await meter.settle(second, settlement(50))
        third = await meter.reserve(pid, kid, 100)
        assert isinstance(third, LeaseHold) and third.lease is not first.lease
    finally:
        await storage.close()


async def test_concurrent_give_backs_return_the_free_part_once(storage):
    """Refused requests give their project's leases back all at once (`_make_room`): the
    free part goes back once, so the holds in flight stay covered and are charged."""
    pid, kid = await funded(storage, 1_000_000)
    meter = LeasedMeter(storage)
    # More than half of the lease in flight: what is free fits twice in what is left.
    holds = [await meter.reserve(pid, kid, 100) for _ in range(SLICE_HOLDS - 2)]
    assert len({hold.lease for hold in holds}) == 1
    free = holds[0].lease.free
    returned = await asyncio.gather(*(meter.give_back(lambda _: True) for _ in range(4)))
    assert sum(returned) == free
    for hold in holds:
        await meter.settle(hold, settlement(100))
    account = await storage.project_account(pid, current_month())
    assert (account.balance, account.reserved) == (1_000_000 - 100 * len(holds), 0)
    await meter.stop()
    assert (await storage.project_account(pid, current_month())).leased == 0


async def test_a_watched_hold_is_direct_and_shown_at_once(storage):
    """A stream's client may read its project as soon as the first byte is out."""
    pid, kid = await funded(storage, 1_000_000)
    meter = LeasedMeter(storage)  # not started: no housekeeping turn shows the leased hold
    assert isinstance(await meter.reserve(pid, kid, 100), LeaseHold)  # writes idle: leased
    watched = await meter.reserve(pid, kid, 100, watched=True)
    assert isinstance(watched, ReservationRecord)
    assert (await storage.project_account(pid, current_month())).reserved == 100
    await meter.stop()


async def test_holds_taken_from_a_lease_show_as_reserved_after_a_turn(storage):
    pid, kid = await funded(storage, 1_000_000)
    meter = LeasedMeter(storage)
    holds = [await meter.reserve(pid, kid, 100) for _ in range(3)]
    granted = holds[0].lease.remaining
    account = await storage.project_account(pid, current_month())
    assert (account.reserved, account.leased) == (0, granted)  # not written yet
    await meter.keep()
    account = await storage.project_account(pid, current_month())
    assert (account.reserved, account.leased) == (300, granted - 300)
    # A hold that a turn showed stops showing when it closes, before its response ends.
    await meter.settle(holds[0], settlement(40))
    await meter.release(holds[1])
    account = await storage.project_account(pid, current_month())
    assert (account.reserved, account.leased) == (100, granted - 40 - 100)
    # One the turn did not show closes without a write.
    later = await meter.reserve(pid, kid, 100)
    await meter.release(later)
    assert later.lease.writes == later.writes
    await meter.stop()


async def test_a_hold_closed_while_a_turn_writes_it_stops_showing(storage):
    """The turn's write of `in_use` is in flight (it counts the hold) when the hold
    closes: once the close returns, the row no longer shows it."""
    pid, kid = await funded(storage, 1_000_000)
    meter = LeasedMeter(storage)
    hold = await meter.reserve(pid, kid, 100)
    turn = asyncio.create_task(meter.keep())
    for _ in range(20):  # until the turn's write (in_use = 100) has started
        await asyncio.sleep(0)
        if hold.lease.writes > hold.writes:
            break
    assert hold.lease.writes == hold.writes + 1 and not turn.done()
    await meter.release(hold)
    assert (await storage.project_account(pid, current_month())).reserved == 0
    await turn
    assert (await storage.project_account(pid, current_month())).reserved == 0
    await meter.stop()


async def test_a_refusal_is_counted_once(storage):
    """A refused direct hold is tried once more after making room: only the request's
    answer, the second refusal, counts in gateway_reservations_refused_total."""
    pid, kid = await funded(storage, 150)
    metrics = Metrics()
    meter = LeasedMeter(storage, metrics, recall_wait_s=0)
    with pytest.raises(InsufficientBalance):
        await meter.reserve(pid, kid, 200)
    found = [line for line in metrics.text().decode().splitlines() if "refused_total{" in line]
    assert found == ['gateway_reservations_refused_total{reason="insufficient_balance"} 1.0']
    await meter.stop()


async def test_a_lease_whose_end_fails_ends_at_the_next_turn(tmp_path):
    """Its owner renews it while the process lives, so a lease whose DELETE failed must
    stay known (retired) until one succeeds: else its money stays held for good."""
    path = tmp_path / "busy.db"
    storage = await SQLiteStorage.open(f"sqlite:///{path}", busy_timeout_s=0.2)
    try:
        pid, kid = await funded(storage, 1_000_000)
        meter = LeasedMeter(storage, idle_s=0)
        await meter.release(await meter.reserve(pid, kid, 100))
        locker = sqlite3.connect(path, isolation_level=None)  # the CLI, an operator...
        locker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StorageError):
            await meter.keep()  # idle: retired, and its DELETE fails
        locker.execute("ROLLBACK")
        locker.close()
        assert (await storage.project_account(pid, current_month())).leased > 0
        await meter.keep()
        assert (await storage.project_account(pid, current_month())).leased == 0
    finally:
        await storage.close()


def committed_then_lost(write):
    """The fault of a connection lost after COMMIT (PostgreSQL): the write lands, the call
    raises."""

    async def lost(record):
        await write(record)
        raise StorageError("connection lost after commit")

    return lost


async def test_a_settlement_that_committed_and_failed_keeps_the_leases_other_holds(storage):
    """Counted as charged: what the lease gives back leaves its other holds covered, so
    they are charged (the lease keeps more than counted if the settlement did not land)."""
    pid, kid = await funded(storage, 1_000_000)
    meter = LeasedMeter(storage)
    first, second = await meter.reserve(pid, kid, 100), await meter.reserve(pid, kid, 100)
    assert isinstance(first, LeaseHold) and first.lease is second.lease
    settle = storage.settle
    storage.settle = committed_then_lost(settle)
    with pytest.raises(StorageError):
        await meter.settle(first, settlement(100))
    storage.settle = settle
    await meter.release(first)
    await meter.give_back(lambda lease: True)  # a refused hold makes room, a recall...
    await meter.settle(second, settlement(100))
    account = await storage.project_account(pid, current_month())
    assert account.balance == 1_000_000 - 200
    await meter.stop()


async def test_a_lease_granted_across_an_admin_change_serves_no_hold(storage):
    """Admitted under the old limits, its grant answered after the change: the new limits
    apply to the hold that asked for it and to every one after."""
    pid, kid = await funded(storage, 1_000_000)
    await storage.update_project(pid, {"monthly_budget": 1000})
    meter = LeasedMeter(storage)
    grant, granted, answer = storage.grant_lease, asyncio.Event(), asyncio.Event()

    async def answered_late(record):
        await grant(record)
        granted.set()
        await answer.wait()

    storage.grant_lease = answered_late
    first = asyncio.create_task(meter.reserve(pid, kid, 50))
    await granted.wait()
    storage.grant_lease = grant
    before = storage.admin_epoch()
    await storage.update_project(pid, {"monthly_budget": 100})
    while storage.admin_epoch() == before:  # PostgreSQL: the notification has arrived
        await storage.health()
    answer.set()
    holds = [await first]
    assert isinstance(holds[0], ReservationRecord)  # held directly, under the new budget
    with pytest.raises(BudgetExceeded):
        for _ in range(3):
            holds.append(await meter.reserve(pid, kid, 50))
    assert len(holds) == 2  # 50 + 50 of 100
    for hold in holds:
        await meter.settle(hold, settlement(50))
    await meter.keep()  # the lease granted across the change ends
    account = await storage.project_account(pid, current_month())
    assert (account.month_spend, account.leased) == (100, 0)


async def test_what_making_room_frees_goes_to_the_retry(storage):
    """The refused process leases nothing of the project while it makes room: a request of
    its own arriving meanwhile holds directly, and the retry finds the money freed."""
    pid, kid = await funded(storage, 1000)
    meter = LeasedMeter(storage, recall_wait_s=0)
    await meter.release(await meter.reserve(pid, kid, 60))  # a lease, unused
    pending = storage.pending_recalls
    small: list[object] = []

    async def a_request_meanwhile(project_id, owner):
        small.append(await meter.reserve(pid, kid, 10))
        return await pending(project_id, owner)

    storage.pending_recalls = a_request_meanwhile
    big = await meter.reserve(pid, kid, 600, watched=True)  # 600 + 10 of 1000
    storage.pending_recalls = pending
    assert isinstance(big, ReservationRecord) and isinstance(small[0], ReservationRecord)
    await meter.release(big)
    await meter.release(small[0])
    await meter.stop()


async def test_a_hold_written_and_failed_is_released_by_the_sweeper(storage):
    """Committed or not, nobody has it: the sweeper deletes it (nothing, if it never
    landed), so that its owner does not keep it renewed."""
    pid, kid = await funded(storage, 1_000_000)
    meter = LeasedMeter(storage)
    reserve = storage.reserve
    storage.reserve = committed_then_lost(reserve)
    with pytest.raises(StorageError):
        await meter.reserve(pid, kid, 100, watched=True)
    storage.reserve = reserve
    assert (await storage.project_account(pid, current_month())).reserved == 100
    await meter._retry_releases()
    assert (await storage.project_account(pid, current_month())).reserved == 0
    await meter.stop()
