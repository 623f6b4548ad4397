"""Requests and tokens per minute shared by the workers of one box (`gateway serve --workers
N` on SQLite without Redis): pipeline/gcra.py's rule over buckets in a file every worker
maps, under a lock, so the workers admit exactly what one process would.

The file (in the parent's run folder, on tmpfs where there is one) is a table of `SLOTS`
slots of `SLOT` bytes: a bucket's name digest (BLAKE2b, 16 bytes), its `at_ms`, its
`level` and when it is full again (`empty_at_ms`), little-endian. A bucket lives in the
first slot, from its digest's home on, that holds its digest; a new one takes the first
slot within `PROBES` of home that is never used or holds a bucket full again (the same as
none). A take or give-back runs whole under an exclusive flock on the file: two system
calls, about 1 µs, and it is held for the few microseconds the rule takes, so a worker
waits at most that long (on the loop: cheaper than any hop off it). Times are
CLOCK_MONOTONIC milliseconds, one clock for every process of the box; the file goes with
the parent (a new one at each start, as the in-process buckets went with the process).

Why not a SQLite table: a take is a write transaction, 108 µs measured against 33 µs here
(bench/workers.py --limiter, two buckets, on a loaded 2-core VM), and a worker that finds
it locked sleeps in SQLite's busy handler (1 ms at least) with the event loop stopped.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

from model_gateway.pipeline.errors import ServiceUnavailable
from model_gateway.pipeline.gcra import Gcra, _monotonic_ms, drained, empty_at
from model_gateway.pipeline.ports import Take, Verdict

SLOTS = 1 << 17  # about 100,000 buckets alive at once (a bucket lives a minute at most)
PROBES = 64
_SLOT = struct.Struct("<16sqqq")  # digest, at_ms, level, empty_at_ms
SLOT = _SLOT.size
_NEVER_USED = bytes(16)


def create_table(path: Path) -> None:
    """The empty table (the parent, before its workers start)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, SLOTS * SLOT)  # sparse: pages are allocated as buckets use them
    finally:
        os.close(fd)


class TableFull(Exception):
    """No slot within PROBES of a new bucket's home."""


class SharedGcra(Gcra):
    def __init__(self, path: Path, clock: Callable[[], int] = _monotonic_ms) -> None:
        super().__init__(clock)
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self._map = mmap.mmap(self._fd, SLOTS * SLOT)

    def take(self, buckets: Sequence[Take]) -> Verdict:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            return super().take(buckets)
        except TableFull:
            raise ServiceUnavailable(
                "Too many rate-limit buckets are in use right now.", retry_after=1
            ) from None
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def give(self, buckets: Sequence[Take]) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            super().give(buckets)
        except TableFull:
            pass  # a give-back with no room: the bucket was full again, nothing is owed
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    # Gcra's state, in the table instead of a dict (called with the lock held).

    def _level(self, name: str, per_minute: int, now: int) -> int:
        found = self._find(_digest(name), now)[1]
        return 0 if found is None else drained(found[1], found[0], now, per_minute)

    def _move(self, buckets: Sequence[Take], now: int, sign: int) -> None:
        """Every bucket moved, or none: two new buckets may find one free slot, and the
        second then finds no room (TableFull) after the first was written, which is put
        back, so that a refused take charges nothing."""
        before: list[tuple[int, bytes]] = []  # each written slot as it was
        try:
            for name, per_minute, units in buckets:
                digest = _digest(name)
                offset, found = self._find(digest, now)
                if found is None:
                    at, level = now, 0
                else:
                    at, level = max(found[0], now), drained(found[1], found[0], now, per_minute)
                level = max(0, level + sign * units * 60_000)
                before.append((offset, self._map[offset : offset + SLOT]))
                _SLOT.pack_into(
                    self._map, offset, digest, at, level, empty_at(at, level, per_minute)
                )
        except TableFull:
            for offset, slot in reversed(before):
                self._map[offset : offset + SLOT] = slot
            raise

    def _prune(self, now: int) -> None:
        """Nothing to prune: a bucket full again is a free slot."""

    def _find(self, digest: bytes, now: int) -> tuple[int, tuple[int, int] | None]:
        """The offset of the bucket's slot and its (at_ms, level); or, not there, the
        offset of the slot a new one takes and None."""
        home = int.from_bytes(digest[:8], "little") % SLOTS
        free = -1
        for probe in range(PROBES):
            offset = ((home + probe) % SLOTS) * SLOT
            held, at, level, empty = _SLOT.unpack_from(self._map, offset)
            if held == digest:
                return offset, (at, level)
            if held == _NEVER_USED:  # the end of the run: the bucket is nowhere after
                return (offset if free < 0 else free), None
            if free < 0 and empty <= now:
                free = offset
        if free < 0:
            raise TableFull
        return free, None

    async def close(self) -> None:
        self._map.close()
        os.close(self._fd)


def _digest(name: str) -> bytes:
    return hashlib.blake2b(name.encode(), digest_size=16).digest()
