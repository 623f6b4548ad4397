"""Random interleavings of reserve, settle, release, credit and crash against a real
database: the ledger's invariants hold after every step."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from storage import LimitReached, ProjectRecord, ReceiptRecord, ReservationRecord, open_storage
from storage.base import KeyRecord

MONTH = "2026-11"
_ids = itertools.count()


class LedgerMachine(RuleBasedStateMachine):
    """The model tracks what the ledger must say; the database must agree at every step."""

    @initialize(
        budget=st.none() | st.integers(0, 20_000),
        limit=st.none() | st.integers(0, 20_000),
        credit=st.integers(0, 4_000),
    )
    def open_database(self, budget, limit, credit):
        self.loop = asyncio.new_event_loop()
        self.folder = tempfile.TemporaryDirectory()
        url = f"sqlite:///{Path(self.folder.name) / 'ledger.db'}"
        self.storage = self.run(open_storage(url))
        project = ProjectRecord(id="prj_m", name="m", monthly_budget=budget)
        self.run(self.storage.create_project(project))
        key = KeyRecord(
            id="key_m",
            prefix="proj_live_machine",
            key_hash=b"x",
            project_id="prj_m",
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
        return f"machine:{generation}"

    @rule(amount=st.integers(0, 2_000))
    def credit(self, amount):
        self.run(self.storage.add_credit("prj_m", amount, MONTH))
        self.credits += amount

    @rule(amount=st.integers(0, 1_500))
    def reserve(self, amount):
        held = sum(a for a, _ in self.open.values())
        balance = self.credits - self.charges
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
            id=f"rsv_{next(_ids)}",
            project_id="prj_m",
            key_id="key_m",
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
            id=f"rcpt_{next(_ids)}",
            reservation_id=rid,
            project_id="prj_m",
            key_id="key_m",
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
                "id": f"rcpt_{next(_ids)}",
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
        self.run(self.storage.release_abandoned(lambda owner: owner == live))
        self.open = {rid: v for rid, v in self.open.items() if v[1] != dead}

    @invariant()
    def books_balance(self):
        audit = self.run(self.storage.audit("prj_m", MONTH))
        assert audit.balance == audit.ledger_sum == self.credits - self.charges
        held = sum(a for a, _ in self.open.values())
        assert audit.reserved == audit.open_reservations_sum == held
        assert audit.month_spend == audit.month_charges_sum == self.charges
        assert audit.balance - audit.reserved >= 0  # never overspent
        assert self.run(self.storage.key_month_spend("key_m", MONTH)) == self.charges
        if self.budget is not None:
            assert self.charges <= self.budget
        if self.limit is not None:
            assert self.charges <= self.limit

    def teardown(self):
        self.run(self.storage.close())
        self.loop.close()
        self.folder.cleanup()


LedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_ledger_invariants = LedgerMachine.TestCase
