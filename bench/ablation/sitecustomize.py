"""Takes one part out of a gateway, to measure what that part costs: Python imports this
module at start-up when bench/ablate.py puts this folder on PYTHONPATH, and it applies
the ablation named by GATEWAY_ABLATION. A measuring tool only: an ablated gateway does
not keep the books (see each ablation).
"""

from __future__ import annotations

import os


def no_settle_sql() -> None:
    """A settlement writes nothing: no receipt, no charge, nothing offered to the log (so
    the log has nothing to do). A direct hold is then never freed: the bench's project
    holds enough for that."""
    from model_gateway.gateway.metering.storage_meter import StorageMeter

    async def charge_nothing(self: StorageMeter, receipt: object) -> bool:
        return True

    StorageMeter._charge = charge_nothing


def no_log() -> None:
    """The transparency log never starts and is offered nothing: receipts stay unlogged."""
    from model_gateway.gateway.proofs.log import TransparencyLog

    async def nothing(self: TransparencyLog) -> None:
        return None

    TransparencyLog.start = nothing
    TransparencyLog.stop = nothing
    TransparencyLog.offer = lambda self, record: None


def inline_write() -> None:
    """A write that finds no batch running or waiting runs at once in its caller's task: no
    batch task, no turn of the loop to gather others. Group commit ends under load (a batch
    runs synchronously, so every write finds none running): measure it one request at a
    time."""
    from model_gateway.storage.batching import Batcher

    queued = Batcher.submit

    async def submit(self: Batcher, item: object) -> object:
        if self._flusher is None and not self._pending:
            (outcome,) = await self._run([item])
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        return await queued(self, item)

    Batcher.submit = submit


def memory_meter() -> None:
    """The request path's meter is pipeline.memory's: holds and charges exact, in memory
    only (no SQL, no receipt, no log). What is left is metering's floor in this design:
    the reservation and settle stages, the hold, the settlement's fields. Every project
    holds 10^15 micro-units."""
    from model_gateway.gateway import app
    from model_gateway.pipeline.memory import MemoryMeter, Project

    class Funded(dict[str, Project]):
        def __missing__(self, project_id: str) -> Project:
            project = self[project_id] = Project(project_id, balance=10**15)
            return project

    build = app.build_pipeline

    def with_memory_meter(**options: object) -> object:
        if options["meter"] is not None:
            options["meter"] = MemoryMeter(Funded(), {})
        return build(**options)

    app.build_pipeline = with_memory_meter


def journal() -> None:
    """What a settlement journal folded by another process would cost this one: each
    receipt is appended to a file with one `write` (msgpack; the file is never folded, so
    the log has nothing to do), and a stream's hold is taken as a chat's is (from a
    lease: no row, shown only by the lease's `in_use` writes). Its numbers are an upper
    bound: the folding process's CPU is not there."""
    import os
    import tempfile

    import msgspec

    from model_gateway.gateway.metering.storage_meter import StorageMeter
    from model_gateway.storage import ReceiptRecord

    descriptor, path = tempfile.mkstemp(prefix="journal-", suffix=".msgpack")
    os.unlink(path)  # gone when the gateway exits
    encode = msgspec.msgpack.Encoder().encode

    async def append(self: StorageMeter, receipt: ReceiptRecord) -> bool:
        os.write(descriptor, encode(receipt))
        return True

    StorageMeter._charge = append
    _stream_holds_from_leases(shown=False)


def commit_after_response() -> None:
    """A settlement's write is started and not awaited: the response goes out first, the
    commit runs after it on the same loop (what a journal folded in this process would
    give). A settlement that fails is then not noticed."""
    import asyncio

    from model_gateway.gateway.metering.storage_meter import StorageMeter
    from model_gateway.storage import ReceiptRecord

    running: set[asyncio.Task[bool]] = set()

    async def started(self: StorageMeter, receipt: ReceiptRecord) -> bool:
        if self.on_settling is not None:
            self.on_settling(receipt)
        task = asyncio.get_running_loop().create_task(self.storage.settle(receipt))
        running.add(task)
        task.add_done_callback(running.discard)
        return True

    StorageMeter._charge = started


def watched_lease() -> None:
    """A stream's hold is taken from a lease like a chat's, even while writes run, and
    shown before the provider is called by an awaited write of the lease's `in_use`."""
    _stream_holds_from_leases(shown=True)


def _stream_holds_from_leases(*, shown: bool) -> None:
    """A watched hold (a stream's) is taken as an unwatched one is; `shown`: from a lease
    even while writes run, then written to the lease's `in_use` before it is returned."""
    from model_gateway.gateway.metering.leased_meter import LeasedMeter, LeaseHold

    reserve = LeasedMeter.reserve

    async def as_unwatched(
        self: LeasedMeter,
        project_id: str,
        key_id: str | None,
        amount: int,
        *,
        watched: bool = False,
    ) -> object:
        if not (watched and shown):
            return await reserve(self, project_id, key_id, amount)
        idle = self.storage.writes_idle
        self.storage.writes_idle = lambda: True  # type: ignore[method-assign]
        try:
            hold = await reserve(self, project_id, key_id, amount)
        finally:
            self.storage.writes_idle = idle  # type: ignore[method-assign]
        if isinstance(hold, LeaseHold):
            await self._write_in_use([hold.lease])
        return hold

    LeasedMeter.reserve = as_unwatched


def leases_always() -> None:
    """An unwatched hold is taken from a lease even while writes run (the idle rule off):
    what written holds cost with hundreds of requests in flight, where writes never idle."""
    from model_gateway.gateway.metering.leased_meter import LeasedMeter

    reserve = LeasedMeter.reserve

    async def from_a_lease(
        self: LeasedMeter,
        project_id: str,
        key_id: str | None,
        amount: int,
        *,
        watched: bool = False,
    ) -> object:
        if watched:
            return await reserve(self, project_id, key_id, amount, watched=True)
        idle = self.storage.writes_idle
        self.storage.writes_idle = lambda: True  # type: ignore[method-assign]
        try:
            return await reserve(self, project_id, key_id, amount)
        finally:
            self.storage.writes_idle = idle  # type: ignore[method-assign]

    LeasedMeter.reserve = from_a_lease


def wide_batches() -> None:
    """Group commit takes up to its largest batch whether or not the loop is busy (no
    lockstep batches of 8 while it has time to spare): what the small batches cost with
    hundreds of requests in flight behind a slow upstream."""
    from model_gateway.storage.batching import Batcher

    Batcher._batch_size = lambda self: self._max_batch


def count_writes(counts: dict | None = None) -> None:
    """Takes nothing out: counts group commit's batches and their statements (by their
    first words), their CPU and wall time (lock waits included), and the checkpoints' wall
    time, and prints the counts to the gateway's log every 2 s and at exit, to read
    how many writes and commits a request costs at a given load."""
    import atexit
    import collections
    import sys
    import threading
    import time

    from model_gateway.storage.group_commit import GroupCommitWriter
    from model_gateway.storage.sqlite.connection import SQLiteBase

    counts = collections.Counter() if counts is None else counts
    run = GroupCommitWriter._run_when_unlocked

    async def counted(self: GroupCommitWriter, batch: list) -> list:
        counts["batches"] = counts.get("batches", 0) + 1
        for sql, _ in batch:
            first = sql.split()[:4]
            words = " ".join(first if first[0] == "UPDATE" else first[:3])
            words += " (a lease)" if " lease) VALUES" in sql else ""
            counts[words] = counts.get(words, 0) + 1
        started, wall = time.thread_time(), time.perf_counter()  # on the loop's thread
        try:
            return await run(self, batch)
        finally:
            add("batch ms", (time.thread_time() - started) * 1e3)
            add("batch wall ms", (time.perf_counter() - wall) * 1e3)  # lock waits too

    def add(key: str, value: float) -> None:
        counts[key] = counts.get(key, 0.0) + value

    checkpoint = SQLiteBase.checkpoint

    async def timed_checkpoint(self: SQLiteBase) -> None:
        wall = time.perf_counter()
        try:
            await checkpoint(self)
        finally:
            add("checkpoints", 1)
            took = (time.perf_counter() - wall) * 1e3
            add("checkpoint wall ms", took)
            counts["longest checkpoint ms"] = max(counts.get("longest checkpoint ms", 0), took)

    def report() -> None:
        print("WRITES", dict(counts), file=sys.stderr, flush=True)

    def every_2s() -> None:
        report()
        timer = threading.Timer(2.0, every_2s)
        timer.daemon = True
        timer.start()

    GroupCommitWriter._run_when_unlocked = counted
    SQLiteBase.checkpoint = timed_checkpoint
    atexit.register(report)
    every_2s()


def gc_stats() -> None:
    """Takes nothing out: times every garbage collection (gc.callbacks, the collecting
    thread's CPU time, which other processes on the machine do not inflate) and prints,
    per generation, how many ran, their CPU ms and the objects they found unreachable,
    with `count-writes`' counts, every 2 s to the gateway's log."""
    import gc
    import time

    stats: dict[str, float] = {}
    started = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.thread_time()
            return
        generation = info["generation"]
        stats[f"gen{generation} runs"] = stats.get(f"gen{generation} runs", 0) + 1
        key = f"gen{generation} ms"
        stats[key] = stats.get(key, 0.0) + (time.thread_time() - started[0]) * 1000
        stats["collected"] = stats.get("collected", 0) + info["collected"]

    gc.callbacks.append(timed)
    count_writes(stats)


def gc_thresholds() -> None:
    """The collector's thresholds from GC_THRESHOLDS (e.g. "50000,10,10") in place of the
    gateway's, set once it has started (with `gc-stats`' report)."""
    import gc

    from model_gateway.gateway.ops import server

    tune = server.tune_garbage_collector

    def retuned() -> None:
        tune()
        gc.set_threshold(*(int(n) for n in os.environ["GC_THRESHOLDS"].split(",")))

    server.tune_garbage_collector = retuned
    gc_stats()


ABLATIONS = {
    "no-settle-sql": no_settle_sql,
    "no-log": no_log,
    "inline-write": inline_write,
    "memory-meter": memory_meter,
    "journal": journal,
    "commit-after-response": commit_after_response,
    "watched-lease": watched_lease,
    "wide-batches": wide_batches,
    "leases-always": leases_always,
    "count-writes": count_writes,
    "gc-stats": gc_stats,
    "gc-thresholds": gc_thresholds,
}

if (_name := os.environ.get("GATEWAY_ABLATION")) is not None:
    ABLATIONS[_name]()
