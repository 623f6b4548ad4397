"""The `Meter` with leases (`[metering] leases`, on by default): requests reserve in memory
against slices of money this process leased, so a request writes one row set, its
settlement.

Rules
-----
- A lease is a hold owned by this process (`reservations` row with `lease`, migration
  0012) for one (project, key, month). It is granted by one INSERT that the reservation
  trigger admits like any hold: the key's monthly limit, the project's monthly budget
  (spend + holds + leases) and the available balance (balance - holds - leases), so a
  lease never takes money a hold could not.
- A request's hold is taken from a lease of its (project, key, month) whose free part
  (what is left of it minus the holds taken from it) covers the hold: no SQL. Its
  settlement is the receipt as today, through group commit, charged against the lease:
  the receipt trigger writes the ledger charge and takes the cost out of the lease, in
  the one statement, and refuses a cost the lease no longer covers. Its release is in
  memory only.
- Short of slice, the process grows: it grants a new lease of a second's worth of the
  slot's holds (at least `SLICE_HOLDS` holds like this one), but never more than half of
  what is left under the tightest of the three limits. When half of what is left does
  not cover the hold, the request takes a direct hold as today (the threshold rule: the
  last money of a project is never leased, so a small balance works with any number of
  processes).
- A direct hold that is refused first gets the money leases keep from it: this process
  gives back the free part of its leases of the project, then recalls the other
  processes' leases of the project (a flag on their rows, which each process polls every
  `POLL_S`) and waits for their answers at most `RECALL_WAIT_S`, then tries once more.
  A process that answers gives back the free part of the recalled lease, takes no new
  hold from it, and serves that project by direct holds for `COOL_DOWN_S`; so does the
  refused process, whose requests would otherwise lease again what it freed before its
  retry. So a request
  is refused only when the holds of requests in flight, wherever they are, leave too
  little: today's rule (a dead process's leases wait for the sweeper, as its holds do).
- A fenced instance (gateway/cluster/instance.py: it lost its registry lease) takes no hold,
  from a lease or direct: the others may be sweeping its leases.
- Requests without a key (hosted agents' steps, whose holds the run tracks by id) always
  take direct holds.
- Only while the process's writes are idle (`Storage.writes_idle`: no batch runs or
  waits) is a hold taken from a lease: there a direct hold would commit alone, the cost
  leases remove. Under load a direct hold shares its batch's commit (group commit), and
  the lease's bookkeeping (the lease row each settlement updates, `in_use` writes) cost
  more than it saves. Measured against writing every hold (paired, both orders): 1.12x
  and 1.13x req/s at one connection, 1.03x and 1.15x at 32; leases for every hold had
  measured 0.88-0.97x at 32 (0.96x and 0.95x again on 2026-11-26, paired in both orders;
  1.00x req/s and CPU on 2026-11-27, 8 rounds, after the log's reads moved to the loop).
- What requests hold of a lease is shown as `reserved` at most `POLL_S` late (their
  lease holds the money from the start): the owner writes it with its housekeeping. A
  watched hold (a stream's: its client may read its project once the first byte is
  out) is direct, so shown before the provider is called.
- Leases go back when unused for `IDLE_S`, on shutdown, and after any admin change (a
  new budget or limit applies to the next hold, as it does today); a lease that still
  has requests in flight gives back its free part and ends when the last one closes.

Invariants (checked by tests/metering/test_leases_state_machine.py)
-------------------------------------------------------------------
- balance = credits - Σ charges (the ledger), charges never above a request's hold.
- `reserved` counter = Σ open rows (holds and leases), `leased` = Σ open leases; what
  `project_account` shows as reserved is the requests' own holds: direct ones, and what
  they hold of leases as the owner last wrote it (`in_use`, migration 0014, written by
  the housekeeping every `POLL_S` while it changes); the rest of the leases apart.
- In this process, for each lease: holds taken from it ≤ what is left of it in the
  database; so the money a process can spend is what it leased, and a lease's owner is
  the only one that charges against it (its id never leaves the process).
- Spend + holds + leases ≤ budget and limit, holds + leases ≤ balance, as for holds.

Crash
-----
A killed process leaves its leases as it leaves its holds: counted, never charged. The
same sweeper (`release_abandoned`: the owner's process is gone, its instance's registry
lease ended, or its own lease, `[cluster] lease_s`, expired) deletes them, at the
restart of this process or from any other; the requests it had in flight were never
charged (their settlement is one statement: committed or not). Every
settlement is committed before the response's last byte, as today. A settlement that
raises (committed or not, the process cannot tell) retires its lease: what the lease's
other requests hold stays covered whichever it was.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Hashable
from typing import Any

import anyio

from model_gateway.gateway.cluster.background import stop_tasks
from model_gateway.gateway.metering.storage_meter import StorageMeter, current_month, receipt_record
from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.ports import Reserved
from model_gateway.storage import LimitReached, ReservationRecord
from model_gateway.storage.batching import Batcher, Outcome

log = logging.getLogger("gateway.metering")

POLL_S = 0.05  # how often a process looks for recalls of its leases
IDLE_S = 2.0  # a lease unused this long goes back
RECALL_WAIT_S = 1.0  # how long a refused request waits for other processes' answers
COOL_DOWN_S = 5.0  # after answering a recall, the project is served by direct holds
SLICE_HOLDS = 8  # a new lease covers at least this many holds like the one that asked
SHARE = 2  # a lease takes at most 1/SHARE of what is left under the tightest limit
DEMAND_WINDOW_S = 1.0
IN_USE_ASKS_PER_WRITE = 256  # at most, in one write of `in_use` (the rest in the next)

Slot = tuple[str, str, str]  # project, key, month


class Lease:
    __slots__ = (
        "gone", "held", "record", "remaining", "retired", "slot", "used_at", "writes", "written"
    )  # fmt: skip

    def __init__(self, record: ReservationRecord, slot: Slot) -> None:
        self.record = record
        self.slot = slot
        self.remaining = record.amount  # what the database has left of it (or less)
        self.held = 0  # holds taken from it, not yet settled or released
        self.written = 0  # `held` as last written to its row (in_use: shown as reserved)
        self.writes = 0  # how many writes of `held` were issued
        self.retired = False  # takes no new hold; ends when its last hold closes
        self.gone = False  # ended in the database
        self.used_at = time.monotonic()

    @property
    def free(self) -> int:
        return self.remaining - self.held

    @property
    def unwritten(self) -> bool:
        """Its row's `in_use` (as last written) is not what its requests hold now."""
        return self.held != self.written


class LeaseHold:
    """A request's hold taken from a lease: exists only in this process."""

    __slots__ = ("amount", "id", "lease", "writes")

    def __init__(self, hold_id: str, amount: int, lease: Lease) -> None:
        self.id = hold_id
        self.amount = amount
        self.lease = lease
        self.writes = lease.writes  # a later write of `held` showed this hold as reserved


class _Demand:
    """The holds a slot asked for over the last window, and its last grant: how big its
    next lease is (a slot that spent its last lease within the window gets twice as much,
    so a burst costs a few grants, not one per `SLICE_HOLDS` holds)."""

    __slots__ = ("current", "granted", "granted_at", "previous", "started")

    def __init__(self) -> None:
        self.started, self.previous, self.current = time.monotonic(), 0, 0
        self.granted, self.granted_at = 0, 0.0

    def add(self, amount: int) -> None:
        now = time.monotonic()
        if now - self.started >= DEMAND_WINDOW_S:
            fresh = now - self.started < 2 * DEMAND_WINDOW_S
            self.started, self.previous, self.current = now, self.current if fresh else 0, 0
        self.current += amount

    def wanted(self, amount: int) -> int:
        recent = time.monotonic() - self.granted_at < DEMAND_WINDOW_S
        doubled = 2 * self.granted if recent else 0
        return max(amount * SLICE_HOLDS, self.previous, self.current, doubled)

    def grant(self, size: int) -> None:
        self.granted, self.granted_at = size, time.monotonic()


class LeasedMeter(StorageMeter):
    def __init__(
        self,
        *args: Any,
        poll_s: float = POLL_S,
        idle_s: float = IDLE_S,
        recall_wait_s: float = RECALL_WAIT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.poll_s, self.idle_s, self.recall_wait_s = poll_s, idle_s, recall_wait_s
        self.slots: dict[Slot, list[Lease]] = {}
        self._demand: dict[Slot, _Demand] = {}
        self._growing: dict[Slot, asyncio.Lock] = {}
        self._cooling: dict[str, float] = {}  # project -> monotonic time it may lease again
        self._retired: set[Lease] = set()
        self._holds = itertools.count()
        # What requests hold of leases goes to their rows one write at a time, each for
        # every lease asked for while the one before ran: a write knows what the rows say
        # (`written`) when it starts, and the last one started lands last (on PostgreSQL,
        # two writes on two connections could commit in either order).
        self._in_use_writes: Batcher[list[Lease], None] = Batcher(
            self._write_in_use_now, IN_USE_ASKS_PER_WRITE
        )
        self._epoch: Hashable = self.storage.admin_epoch()
        self._keeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await super().start()
        self._keeper = asyncio.create_task(self._keep_forever())

    async def stop(self) -> None:
        with anyio.CancelScope(shield=True):
            await stop_tasks(self._keeper)
            try:
                await self.give_back(lambda lease: True)
            except Exception:
                log.exception("could not give leases back; the sweeper will")
            await self._in_use_writes.close()
        await super().stop()

    # -- the Meter port -----------------------------------------------------------------

    async def reserve(
        self, project_id: str, key_id: str | None, amount: int, *, watched: bool = False
    ) -> Reserved:
        if self.instance is not None:  # a fenced instance serves nothing, leases included
            self.instance.check_serving()
        if (
            key_id is None
            or watched
            or self._cooling.get(project_id, 0.0) > time.monotonic()
            or not self.storage.writes_idle()
        ):
            return await self._direct(project_id, key_id, amount)
        epoch = self.storage.admin_epoch()
        if epoch != self._epoch:  # new limits or budgets apply from this hold on
            self._epoch = epoch
            self._retire_all()
            return await self._direct(project_id, key_id, amount)
        slot = (project_id, key_id, current_month())
        demand = self._demand.get(slot)
        if demand is None:
            demand = self._demand[slot] = _Demand()
        demand.add(amount)
        lease = self._take(slot, amount) or await self._grow(slot, amount, demand)
        if lease is None:
            return await self._direct(project_id, key_id, amount)
        lease.held += amount
        self.open_holds += 1
        return LeaseHold(f"{lease.record.id}:{next(self._holds)}", amount, lease)

    async def settle(self, reservation: Reserved, settlement: Settlement) -> None:
        if not isinstance(reservation, LeaseHold):
            await super().settle(reservation, settlement)
            return
        lease = reservation.lease
        try:
            # The lease covers the cost; the request's own hold is checked here.
            charged = settlement.cost <= reservation.amount and await self._charge(
                receipt_record(lease.record, settlement)
            )
        except BaseException:
            # Committed or not, we cannot tell: counted as charged, so that what the lease
            # gives back never includes it (the lease keeps more than we count, never
            # less), and the lease takes no new hold. The hold stays open.
            lease.remaining -= settlement.cost
            self._retire(lease)
            raise
        lease.held -= reservation.amount
        self.open_holds -= 1
        if charged:
            lease.remaining -= settlement.cost
        else:
            log.error("lease %s did not cover a settlement; not charged", lease.record.id)
            self._retire(lease)  # gone (swept) or short: it takes no new hold
        if self.metrics is not None:
            self.metrics.charged(settlement)
        await self._unshow(reservation)

    async def release(self, reservation: Reserved) -> None:
        if not isinstance(reservation, LeaseHold):
            await super().release(reservation)
            return
        reservation.lease.held -= reservation.amount
        self.open_holds -= 1
        await self._unshow(reservation)

    async def _unshow(self, hold: LeaseHold) -> None:
        """A closed hold that a write showed as reserved stops showing before its response
        ends: a client that reads its project next finds it gone. (Under load, about one
        request in five spans a housekeeping turn: one more statement in a batch.)"""
        lease = hold.lease
        if hold.writes == lease.writes or lease.gone:  # no write ever showed it
            return
        try:
            await self._write_in_use([lease])
        except Exception:
            log.exception("could not write what lease %s holds; retrying", lease.record.id)

    # -- taking and growing ---------------------------------------------------------------

    def _take(self, slot: Slot, amount: int) -> Lease | None:
        for lease in self.slots.get(slot, ()):
            if lease.free >= amount:
                lease.used_at = time.monotonic()
                return lease
        return None

    async def _grow(self, slot: Slot, amount: int, demand: _Demand) -> Lease | None:
        """A new lease for the slot, or None when half of what is left would not cover
        the hold (or the grant lost a race): the request then holds directly."""
        lock = self._growing.get(slot)
        if lock is None:
            lock = self._growing[slot] = asyncio.Lock()
        async with lock:
            if self.storage.admin_epoch() != self._epoch:
                return None  # an admin change landed while this request waited: hold directly
            lease = self._take(slot, amount)  # another request grew it meanwhile
            if lease is not None:
                return lease
            project_id, key_id, month = slot
            figures = await self.storage.limit_figures(project_id, key_id, month)
            size = min(demand.wanted(amount), _room(figures) // SHARE)
            if size < max(amount, 1):
                return None
            record = self._hold_record(project_id, key_id, size, month)
            epoch = self.storage.admin_epoch()
            try:
                await self._write_hold(record, self.storage.grant_lease)
            except LimitReached:
                return None
            if self.storage.admin_epoch() != epoch:
                # An admin change landed while the grant ran, which may have admitted it
                # under the old limits: it serves no hold (the new limits apply to this
                # one), and the housekeeping ends it.
                retired = Lease(record, slot)
                retired.retired = True
                self._retired.add(retired)
                return None
            demand.grant(size)
            # The slot's other leases could not cover this hold: they take no more, give
            # back what is free and end when their requests close.
            for short in list(self.slots.get(slot, ())):
                self._retire(short)
            lease = Lease(record, slot)
            self.slots.setdefault(slot, []).append(lease)
            return lease

    async def _direct(self, project_id: str, key_id: str | None, amount: int) -> Reserved:
        """Today's atomic hold; refused, it first gets back what leases keep from it."""
        try:
            return await self._hold(project_id, key_id, amount, current_month())
        except LimitReached:
            # Once more in every case: a lease another process ended on its own while we
            # were refused is not recalled, but its money is back all the same. Only this
            # second refusal is the request's (counted and explained).
            await self._make_room(project_id)
        return await super().reserve(project_id, key_id, amount)

    async def _make_room(self, project_id: str) -> None:
        """Give back this process's free leased money of the project and ask the others
        for theirs, waiting at most `recall_wait_s` for their answers. Until the cool-down
        ends this process serves the project by direct holds too, so that what it frees
        goes to the retry, not to a new lease of its own."""
        self._cooling[project_id] = time.monotonic() + COOL_DOWN_S
        await self.give_back(lambda lease: lease.record.project_id == project_id)
        await self.storage.recall_leases(project_id, self.owner)
        pending = await self.storage.pending_recalls(project_id, self.owner)
        deadline = time.monotonic() + self.recall_wait_s
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(self.poll_s)
            pending = await self.storage.pending_recalls(project_id, self.owner)

    # -- giving back ----------------------------------------------------------------------

    async def give_back(self, which: Callable[[Lease], bool]) -> int:
        """Retire the leases `which(lease)` picks and give back their free part now (the
        rest when their requests close); how much went back."""
        returned = 0
        for lease in self._leases():
            if which(lease):
                self._retire(lease)
                returned += await self._return_free(lease)
        return returned

    def _leases(self) -> list[Lease]:
        """Every lease this process holds: those it takes holds from, and the retired."""
        return [*(lease for leases in self.slots.values() for lease in leases), *self._retired]

    def _retire(self, lease: Lease) -> None:
        if lease.retired:
            return
        lease.retired = True
        leases = self.slots[lease.slot]
        leases.remove(lease)
        if not leases:
            del self.slots[lease.slot]
        self._retired.add(lease)

    def _retire_all(self) -> None:
        for leases in list(self.slots.values()):
            for lease in list(leases):
                self._retire(lease)

    async def _return_free(self, lease: Lease, *, answer: bool = False) -> int:
        """End a retired lease without holds; else give back its free part (even 0 when
        it answers a recall: that clears the flag)."""
        if lease.gone:
            return 0
        if lease.held == 0:
            lease.gone = True  # a concurrent give-back finds nothing to end
            try:
                await self.storage.release(lease.record.id)
            except BaseException:
                # Still retired: the next housekeeping (or `stop`) ends it, and until then
                # its owner's renewals keep it, so it must not be forgotten.
                lease.gone = False
                raise
            self._retired.discard(lease)
            return lease.remaining
        free = lease.free
        if not (free or answer):
            return 0
        # Taken out before the write: a concurrent give-back (refused requests make room
        # all at once) finds nothing free, so the money of the holds in flight never goes
        # back twice. Should the write fail, the lease keeps more than we count: safe.
        lease.remaining -= free
        return free if await self.storage.return_lease(lease.record.id, free) else 0

    # -- housekeeping ---------------------------------------------------------------------

    async def _keep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.keep()
            except Exception:
                log.exception("lease housekeeping failed; retrying")

    async def keep(self) -> None:
        """One turn: show what requests hold of the leases, answer recalls, give back idle
        leases, end retired ones whose last request closed."""
        if self.slots or self._retired:
            await self._mark_in_use()
            await self._answer_recalls()
        idle_since = time.monotonic() - self.idle_s
        await self.give_back(lambda lease: lease.used_at < idle_since)
        for lease in [lease for lease in self._retired if lease.held == 0]:
            await self._return_free(lease)
        self._forget_quiet_slots()

    def _forget_quiet_slots(self) -> None:
        """Memory stays flat however many keys and months come and go."""
        now = time.monotonic()
        quiet = [
            slot
            for slot, demand in self._demand.items()
            if slot not in self.slots and now - demand.started > 2 * DEMAND_WINDOW_S
        ]
        for slot in quiet:
            del self._demand[slot]
            lock = self._growing.get(slot)
            if lock is not None and not lock.locked():
                del self._growing[slot]
        for project_id in [p for p, until in self._cooling.items() if until < now]:
            del self._cooling[project_id]

    async def _mark_in_use(self) -> None:
        """Write what requests hold of each lease that changed, so that `reserved` shows
        the requests' own holds (at most a turn, `poll_s`, late)."""
        changed = [lease for lease in self._leases() if lease.unwritten]
        if changed:
            await self._write_in_use(changed)

    async def _write_in_use(self, leases: list[Lease]) -> None:
        """Write what requests hold of each lease, in a write that starts after this call:
        one in flight may have counted a hold that closed since."""
        await self._in_use_writes.submit(leases)

    async def _write_in_use_now(self, asked: list[list[Lease]]) -> list[Outcome[None]]:
        leases = dict.fromkeys(lease for group in asked for lease in group)
        uses = [(lease, lease.held) for lease in leases if lease.unwritten]
        if uses:
            for lease, _ in uses:
                lease.writes += 1
            await self.storage.mark_in_use([(lease.record.id, held) for lease, held in uses])
            for lease, held in uses:
                lease.written = held
        return [None] * len(asked)

    async def _answer_recalls(self) -> None:
        recalled = set(await self.storage.recalled_leases(self.owner))
        if not recalled:
            return
        known = {lease.record.id: lease for lease in self._leases()}
        for lease_id in recalled:
            lease = known.get(lease_id)
            if lease is None:  # ended meanwhile: nothing to give
                continue
            self._cooling[lease.record.project_id] = time.monotonic() + COOL_DOWN_S
            self._retire(lease)
            await self._return_free(lease, answer=True)  # clears its flag, or ends it


def _room(figures: dict[str, int | None]) -> int:
    """What is left under the tightest of the balance, the budget and the key's limit."""

    def left(limit: int | None, spent: int | None, held: int | None) -> int | None:
        return None if limit is None else limit - (spent or 0) - (held or 0)

    balance, reserved = figures["balance"] or 0, figures["reserved"] or 0
    rooms = [
        balance - reserved,
        left(figures["monthly_budget"], figures["month_spend"], reserved),
        left(figures.get("key_monthly_limit"), figures.get("key_month_spend"),
             figures.get("key_reserved")),
    ]  # fmt: skip
    return min(room for room in rooms if room is not None)
