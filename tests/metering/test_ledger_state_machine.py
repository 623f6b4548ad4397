"""Random interleavings of reserve, settle, release, credit and crash against a real
database of every backend: the ledger's invariants hold after every step."""

from __future__ import annotations

import asyncio
import itertools
import secrets

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from model_gateway.storage import (
    LimitReached,
    ProjectRecord,
    ReceiptRecord,
    ReservationRecord,
    Storage,
    open_storage,
)
from model_gateway.storage.base import KeyRecord

MONTH = "2026-11"
_ids = itertools.count()
# This run's PostgreSQL database is shared by the worker's tests, and another file counts
# its ids from 0 too (tests/storage/test_metering_conformance.py): ours carry a mark of
# this process, or a receipt id may already be taken.
_RUN = secrets.token_hex(3)


class LedgerMachine(RuleBasedStateMachine):
    """The model tracks what the ledger must say; the database must agree at every step.

    Examples share one handle on one database of a backend (set per test), each on a
    project and key of its own: opening a pool per example made shrinking take minutes."""

    loop: asyncio.AbstractEventLoop
    storage: Storage

    @initialize(
        budget=st.none() | st.integers(0, 4_000),
        limit=st.none() | st.integers(0, 4_000),
        credit=st.integers(0, 6_000),
    )
    def open_database(self, budget, limit, credit):
        n = next(_ids)
        self.pid, self.kid, self.n = f"prj_m{_RUN}{n}", f"key_m{_RUN}{n}", n
        project = ProjectRecord(id=self.pid, name="m", monthly_budget=budget)
        self.run(self.storage.create_project(project))
        key = KeyRecord(
            id=self.kid,
            prefix=f"proj_live_m{_RUN}{n:06d}",
            key_hash=b"x",
            project_id=self.pid,
            scopes=frozenset({"inference"}),
            monthly_limit=limit,
        )
        self.run(self.storage.create_key(key))
        self.budget, self.limit = budget, limit
        self.generation = 0
        self.open: dict[str, tuple[int, int]] = {}  # reservation id -> (amount, generation)
        self.credits = self.charges = 0
        self.credit(credit)

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def owner(self, generation: int) -> str:
        return f"machine:{self.n}:{generation}"

    @rule(amount=st.integers(0, 2_000))
    def credit(self, amount):
        self.run(self.storage.add_credit(self.pid, amount, MONTH))
        self.credits += amount

    @rule(data=st.data())
    def reserve(self, data):
        held = sum(a for a, _ in self.open.values())
        balance = self.credits - self.charges
        # Amounts at each rule's edge (what is left of it, and one more) half of the time:
        # a rule that forgets the open holds, or is off by one, shows only there.
        edges = [balance - held]
        for cap in (self.budget, self.limit):
            if cap is not None:
                edges.append(cap - self.charges - held)
        at_edges = sorted({e + d for e in edges for d in (0, 1) if e + d >= 0})
        amounts = st.integers(0, 1_500)
        if at_edges:
            amounts = amounts | st.sampled_from(at_edges)
        amount = data.draw(amounts, label="amount")
        over_limit = self.limit is not None and self.charges + held + amount > self.limit
        over_budget = self.budget is not None and self.charges + held + amount > self.budget
        expected = (
            "budget_exceeded"
            if over_limit or over_budget
            else "insufficient_balance"
            if balance - held < amount
            else None
        )
        reservation = ReservationRecord(
            id=f"rsv_m{_RUN}{next(_ids)}",
            project_id=self.pid,
            key_id=self.kid,
            amount=amount,
            month=MONTH,
            owner=self.owner(self.generation),
            lease_until=2**40,
            created_at=0,
        )
        try:
            self.run(self.storage.reserve(reservation))
            outcome = None
        except LimitReached as refused:
            outcome = refused.reason
        event(f"reserve {expected} -> {outcome}")
        assert outcome == expected
        if outcome is None:
            self.open[reservation.id] = (amount, self.generation)

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def settle(self, data):
        rid = data.draw(st.sampled_from(sorted(self.open)))
        amount, _ = self.open[rid]
        cost = data.draw(st.integers(0, amount))
        receipt = ReceiptRecord(
            id=f"rcpt_m{_RUN}{next(_ids)}",
            reservation_id=rid,
            project_id=self.pid,
            key_id=self.kid,
            request_id="req_m",
            kind="inference",
            endpoint="/v1/chat/completions",
            model_or_runtime="echo-1",
            status="succeeded",
            usage={},
            cost=cost,
            month=MONTH,
            created_at=0,
            request_sha256="0" * 64,
            response_sha256="0" * 64,
        )
        assert self.run(self.storage.settle(receipt)) is True
        # Settling the same hold again must never charge twice.
        again = ReceiptRecord(
            **{
                **{f: getattr(receipt, f) for f in receipt.__struct_fields__},
                "id": f"rcpt_m{_RUN}{next(_ids)}",
            }
        )
        assert self.run(self.storage.settle(again)) is False
        del self.open[rid]
        self.charges += cost

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def release(self, data):
        rid = data.draw(st.sampled_from(sorted(self.open)))
        self.run(self.storage.release(rid))
        del self.open[rid]

    @rule()
    def crash(self):
        """The serving process dies (kill -9); its successor sweeps the dead owner's holds."""
        dead = self.generation
        self.generation += 1
        live = self.owner(self.generation)
        ours = self.owner(0).rsplit(":", 1)[0] + ":"

        def alive(owner: str) -> bool | None:
            # Other examples' holds (the database is shared) are not this machine's to judge.
            return owner == live if owner.startswith(ours) else None

        self.run(self.storage.release_abandoned(alive))
        self.open = {rid: v for rid, v in self.open.items() if v[1] != dead}

    @invariant()
    def books_balance(self):
        audit = self.run(self.storage.audit(self.pid, MONTH))
        assert audit.balance == audit.ledger_sum == self.credits - self.charges
        held = sum(a for a, _ in self.open.values())
        assert audit.reserved == audit.open_reservations_sum == held
        assert audit.month_spend == audit.month_charges_sum == self.charges
        assert audit.balance - audit.reserved >= 0  # never overspent
        assert self.run(self.storage.key_month_spend(self.kid, MONTH)) == self.charges
        if self.budget is not None:
            assert self.charges <= self.budget
        if self.limit is not None:
            assert self.charges <= self.limit


def test_ledger_invariants(storage_url):
    """The machine on each backend (tests/storage/backends.py), on a loop of its own:
    hypothesis drives it synchronously."""
    loop = asyncio.new_event_loop()
    storage = loop.run_until_complete(open_storage(storage_url))
    machine = type("LedgerMachineOn", (LedgerMachine,), {"loop": loop, "storage": storage})
    try:
        run_state_machine_as_test(
            machine, settings=settings(max_examples=150, stateful_step_count=40, deadline=None)
        )
    finally:
        loop.run_until_complete(storage.close())
        loop.close()
