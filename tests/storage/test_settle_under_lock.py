"""A settlement that cannot be written (another connection holds the database's write
lock past the busy timeout) raises StorageError, neither hanging nor succeeding silently,
and leaves the hold open so that its owner's release frees it (hardening item 4)."""

from __future__ import annotations

import asyncio
import sqlite3
import time

from model_gateway.storage import ProjectRecord, ReservationRecord, StorageError
from model_gateway.storage.sqlite import SQLiteStorage
from tests.storage.test_metering_conformance import receipt

MONTH = "2026-11"
BUSY_S = 0.3


def hold(rid: str, amount: int) -> ReservationRecord:
    return ReservationRecord(
        id=rid,
        project_id="prj_s",
        key_id=None,
        amount=amount,
        month=MONTH,
        owner="t:1:1",
        lease_until=2**40,
        created_at=0,
    )


async def assert_invariants(store: SQLiteStorage) -> None:
    audit = await store.audit("prj_s", MONTH)
    assert audit.balance == audit.ledger_sum
    assert audit.reserved == audit.open_reservations_sum
    assert audit.month_spend == audit.month_charges_sum


async def opened(tmp_path, busy_timeout_s: float) -> tuple[SQLiteStorage, ReservationRecord]:
    store = await SQLiteStorage.open(
        f"sqlite:///{tmp_path / 's.db'}", busy_timeout_s=busy_timeout_s
    )
    await store.create_project(ProjectRecord(id="prj_s", name="s"))
    await store.add_credit("prj_s", 1_000, MONTH)
    r = hold("rsv_s", 300)
    await store.reserve(r)
    return store, r


async def test_a_settle_locked_out_past_the_busy_timeout_fails_and_the_hold_can_be_released(
    tmp_path,
):
    store, r = await opened(tmp_path, BUSY_S)
    try:
        other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # as the reproduction did: another writer holds on
        try:
            started = time.monotonic()
            try:
                settled = await asyncio.wait_for(store.settle(receipt(r, 120)), 10)
            except StorageError as exc:
                failure: StorageError | None = exc
            else:
                raise AssertionError(f"settle returned {settled} under a held write lock")
            waited = time.monotonic() - started
            assert failure is not None and "SQLITE_BUSY" in str(failure)
            assert BUSY_S * 0.9 <= waited < 5, f"gave up after {waited:.2f} s"
            # Nothing was charged, the hold is still open, and reads still answer (WAL).
            account = await store.project_account("prj_s", MONTH)
            assert (account.balance, account.reserved, account.month_spend) == (1_000, 300, 0)
            assert await store.get_receipt(f"rcpt_{r.id}") is None
        finally:
            other.execute("ROLLBACK")
            other.close()
        # The lock is gone: the owner's release frees the hold, and the books balance.
        await store.release(r.id)
        account = await store.project_account("prj_s", MONTH)
        assert (account.balance, account.reserved, account.month_spend) == (1_000, 0, 0)
        await assert_invariants(store)
        assert not await store.settle(receipt(r, 120))  # released: never charged afterwards
        assert (await store.project_account("prj_s", MONTH)).balance == 1_000
    finally:
        await store.close()


async def test_a_lock_shorter_than_the_busy_timeout_only_delays_the_settle(tmp_path):
    store, r = await opened(tmp_path, 5.0)
    try:
        other = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        settle = asyncio.create_task(store.settle(receipt(r, 120)))
        await asyncio.sleep(0.3)
        assert not settle.done()
        other.execute("ROLLBACK")
        other.close()
        assert await asyncio.wait_for(settle, 5)
        account = await store.project_account("prj_s", MONTH)
        assert (account.balance, account.reserved, account.month_spend) == (880, 0, 120)
        await assert_invariants(store)
    finally:
        await store.close()


async def test_a_settle_whose_cost_sqlite_cannot_store_fails_without_hanging(tmp_path):
    """A cost beyond 64 bits (absurd usage from an upstream) used to kill the group-commit
    flusher: the settle, and every write queued with it, then waited forever."""
    store, r = await opened(tmp_path, 5.0)
    try:
        neighbour = hold("rsv_n", 100)
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                store.settle(receipt(r, 2**63)), store.reserve(neighbour), return_exceptions=True
            ),
            10,
        )
        assert isinstance(outcomes[0], StorageError), outcomes[0]
        assert outcomes[1] is None  # the other write of the same batch went through
        account = await store.project_account("prj_s", MONTH)
        assert (account.balance, account.reserved) == (1_000, 400)
        await store.release(r.id)  # the failed settle left its hold open: its owner frees it
        assert (await store.project_account("prj_s", MONTH)).reserved == 100
        await assert_invariants(store)
        assert await asyncio.wait_for(store.settle(receipt(neighbour, 10)), 10)
    finally:
        await store.close()
