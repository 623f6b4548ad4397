"""Random interleavings of reserve, settle, release, lease grant (a reserve that grows), lease
return, recall, credit and crash across two processes, each a `LeasedMeter` on a handle of
its own over one database of every backend: today's ledger invariants hold after every
step, and a request is refused exactly when today's rule (balance, budget, limit against
the holds of every request in flight) refuses it."""

from __future__ import annotations

import asyncio
import itertools

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

from model_gateway.gateway.metering.leased_meter import LeasedMeter, LeaseHold
from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.errors import BudgetExceeded, InsufficientBalance
from model_gateway.storage import ProjectRecord, Storage, open_storage
from model_gateway.storage.base import KeyRecord, ReservationRecord

_ids = itertools.count()


def settlement(cost: int) -> Settlement:
    return Settlement(
        receipt_id=f"rcpt_l{next(_ids)}",
        request_id="req_l",
        kind="inference",
        endpoint="/v1/chat/completions",
        subject="echo-1",
        status="succeeded",
        usage={},
        cost=cost,
        request_body=b"{}",
        response_sha256=None,
        usage_source="provider",
        provider="echo",
    )


class LeasesMachine(RuleBasedStateMachine):
    """Two processes on one project and key; the model is what the ledger must say."""

    loop: asyncio.AbstractEventLoop
    handles: tuple[Storage, Storage]

    @initialize(
        budget=st.none() | st.integers(0, 4_000),
        limit=st.none() | st.integers(0, 4_000),
        credit=st.integers(0, 6_000),
    )
    def open_project(self, budget, limit, credit):
        n = next(_ids)
        self.pid, self.kid, self.n = f"prj_l{n}", f"key_l{n}", n
        storage = self.handles[0]
        self.run(
            storage.create_project(ProjectRecord(id=self.pid, name="l", monthly_budget=budget))
        )
        key = KeyRecord(
            id=self.kid,
            prefix=f"proj_live_l{n:08d}",
            key_hash=b"x",
            project_id=self.pid,
            scopes=frozenset({"inference"}),
            monthly_limit=limit,
        )
        self.run(storage.create_key(key))
        self.month = current_month()
        self.budget, self.limit = budget, limit
        self.generations = [0, 0]
        self.meters = [self.new_meter(0), self.new_meter(1)]
        self.open: dict[int, tuple[int, object]] = {}  # -> (process, hold)
        self.credits = self.charges = 0
        self.credit(credit)

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def owner(self, process: int) -> str:
        return f"leases:{self.n}.{process}:{self.generations[process]}"

    def new_meter(self, process: int) -> LeasedMeter:
        # Not started: the machine turns each one's housekeeping itself (below), so that
        # every step ends with both processes at rest.
        meter = LeasedMeter(self.handles[process], poll_s=0.001, idle_s=10**6, recall_wait_s=5)
        meter.owner = self.owner(process)
        return meter

    async def while_others_answer(self, process: int, work):
        """`work` of one process while the other keeps answering recalls, as its
        housekeeping task would."""
        task = asyncio.ensure_future(work)
        while not task.done():
            await self.meters[1 - process].keep()
            await asyncio.sleep(0.001)
        return task.result()

    def held(self) -> int:
        return sum(hold.amount for _, hold in self.open.values())

    @rule(amount=st.integers(0, 2_000))
    def credit(self, amount):
        self.run(self.handles[0].add_credit(self.pid, amount, self.month))
        self.credits += amount

    @rule(process=st.sampled_from([0, 1]), data=st.data())
    def reserve(self, process, data):
        held, balance = self.held(), self.credits - self.charges
        edges = [balance - held]
        for cap in (self.budget, self.limit):
            if cap is not None:
                edges.append(cap - self.charges - held)
        at_edges = sorted({e + d for e in edges for d in (0, 1) if e + d >= 0})
        amounts = st.integers(0, 1_500)
        if at_edges:
            amounts = amounts | st.sampled_from(at_edges)
        amount = data.draw(amounts, label="amount")
        over_cap = any(
            cap is not None and self.charges + held + amount > cap
            for cap in (self.budget, self.limit)
        )
        expected = (
            "budget_exceeded" if over_cap else "insufficient_balance" if balance < held + amount
            else None
        )  # fmt: skip
        meter = self.meters[process]
        try:
            hold = self.run(
                self.while_others_answer(process, meter.reserve(self.pid, self.kid, amount))
            )
            outcome = None
        except (BudgetExceeded, InsufficientBalance) as refused:
            outcome = refused.type
        event(f"reserve {expected} -> {outcome}")
        assert outcome == expected
        if outcome is None:
            event("leased" if isinstance(hold, LeaseHold) else "direct")
            self.open[next(_ids)] = (process, hold)

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def settle(self, data):
        which = data.draw(st.sampled_from(sorted(self.open)))
        process, hold = self.open.pop(which)
        cost = data.draw(st.integers(0, hold.amount))
        self.run(self.meters[process].settle(hold, settlement(cost)))
        self.charges += cost

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def release(self, data):
        which = data.draw(st.sampled_from(sorted(self.open)))
        process, hold = self.open.pop(which)
        self.run(self.meters[process].release(hold))

    @rule(process=st.sampled_from([0, 1]))
    def give_back(self, process):
        """Idle, or shutting down: every lease of the process goes back (what its requests
        in flight still hold, once they close)."""
        self.run(self.meters[process].give_back(lambda lease: True))

    @rule(process=st.sampled_from([0, 1]))
    def keep(self, process):
        """A turn of the process's housekeeping: shows what its requests hold of its
        leases, ends its retired leases, answers recalls."""
        meter = self.meters[process]
        self.run(meter.keep())
        assert all(lease.written == lease.held for lease in meter._leases())

    @rule(process=st.sampled_from([0, 1]))
    def crash(self, process):
        """kill -9: the process's holds and leases stay until the sweeper of a live one."""
        dead = self.owner(process)
        self.generations[process] += 1
        self.meters[process] = self.new_meter(process)
        self.open = {k: v for k, v in self.open.items() if v[0] != process}
        self.run(
            self.handles[1 - process].release_abandoned(lambda o: False if o == dead else None)
        )

    @invariant()
    def books_balance(self):
        storage = self.handles[0]
        audit = self.run(storage.audit(self.pid, self.month))
        assert audit.balance == audit.ledger_sum == self.credits - self.charges
        assert audit.reserved == audit.open_reservations_sum
        assert audit.month_spend == audit.month_charges_sum == self.charges
        assert audit.balance - audit.reserved >= 0  # never overspent
        assert self.run(storage.key_month_spend(self.kid, self.month)) == self.charges
        leased, leases_sum = self.run(storage.lease_audit(self.pid))
        assert leased == leases_sum
        # What each live process believes it leased is what the database holds for it,
        # and it holds no more from a lease than what is left of it.
        believed = shown_in_use = 0
        for meter in self.meters:
            for lease in meter._leases():
                assert 0 <= lease.held <= lease.remaining and not lease.gone
                believed += lease.remaining
                shown_in_use += min(lease.written, lease.remaining)
        assert believed == leased
        # `reserved` shows the requests' own holds: direct ones, and what they hold of the
        # leases as last written (a housekeeping turn writes it); the rest is `leased`.
        account = self.run(storage.project_account(self.pid, self.month))
        direct = [h for _, h in self.open.values() if isinstance(h, ReservationRecord)]
        assert account.reserved == sum(h.amount for h in direct) + shown_in_use
        assert account.leased == leased - shown_in_use
        for cap in (self.budget, self.limit):
            if cap is not None:
                assert self.charges <= cap

    def teardown(self):
        if hasattr(self, "meters"):  # crash-like: the next example's sweep is not ours
            for meter in self.meters:
                self.run(meter.give_back(lambda lease: True))


def test_lease_invariants(fresh_storage_url):  # its crashes sweep the whole database
    loop = asyncio.new_event_loop()
    handles = (
        loop.run_until_complete(open_storage(fresh_storage_url)),
        loop.run_until_complete(open_storage(fresh_storage_url)),
    )
    machine = type("LeasesMachineOn", (LeasesMachine,), {"loop": loop, "handles": handles})
    try:
        run_state_machine_as_test(
            machine, settings=settings(max_examples=100, stateful_step_count=40, deadline=None)
        )
    finally:
        for handle in handles:
            loop.run_until_complete(handle.close())
        loop.close()
