"""The group commit's writer gathers a commit's WAL frames into one write (storage/_walbuf.c).
What SQLite promises must hold as without it: another connection or process sees a commit
whole and at once, the WAL restarts and grows past the gathering buffer, and a writer
killed mid-stream loses nothing it reported committed."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from model_gateway.storage._batch import Writer

SCHEMA = """
PRAGMA journal_mode = WAL;
CREATE TABLE rows (id INTEGER PRIMARY KEY, batch INTEGER NOT NULL, a TEXT, b TEXT, data BLOB);
CREATE INDEX rows_a ON rows (a);
CREATE INDEX rows_b ON rows (b);
CREATE TABLE totals (id INTEGER PRIMARY KEY, rows INTEGER NOT NULL);
INSERT INTO totals VALUES (1, 0);
"""
INSERT = "INSERT INTO rows (batch, a, b, data) VALUES (?, ?, ?, ?)"
COUNT = "UPDATE totals SET rows = rows + ? WHERE id = 1"
PRAGMAS = ("journal_mode = WAL", "synchronous = NORMAL", "wal_autocheckpoint = 0")
ROWS_A_BATCH = 5


def batch(number: int, data: bytes = b"x" * 300) -> list:
    """Rows spread over the table and both indexes (several pages), and the total."""
    rows = [
        (INSERT, (number, os.urandom(8).hex(), os.urandom(8).hex(), data))
        for _ in range(ROWS_A_BATCH)
    ]
    return [*rows, (COUNT, (ROWS_A_BATCH,))]


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "gather.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA)
    return path


def write_calls() -> int:
    """Write system calls made by this thread so far (pwrite included)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError("no syscw in /proc/thread-self/io")


def test_a_commit_of_several_pages_reaches_the_wal_in_one_write(db):
    writer = Writer(str(db), PRAGMAS)
    plain = sqlite3.connect(db, isolation_level=None)
    try:
        writer.run(batch(0))  # the WAL's header is written once, with the first commit
        before = write_calls()
        for number in range(1, 21):
            writer.run(batch(number))
        gathered = write_calls() - before

        before = write_calls()
        for number in range(21, 41):
            plain.execute("BEGIN IMMEDIATE")
            for sql, params in batch(number):
                plain.execute(sql, params)
            plain.execute("COMMIT")
        unbuffered = write_calls() - before
    finally:
        plain.close()
        writer.close()
    assert gathered == 20  # one write a commit
    assert unbuffered >= 20 * 2 * 4  # SQLite alone: two a frame, a frame a page changed


def test_another_connection_sees_each_commit_as_soon_as_it_returns(db):
    writer = Writer(str(db), PRAGMAS)
    reader = sqlite3.connect(db, isolation_level=None)
    try:
        for number in range(50):
            assert writer.run(batch(number)) == [1] * ROWS_A_BATCH + [1]
            found = reader.execute("SELECT count(*) FROM rows WHERE batch = ?", (number,))
            assert found.fetchone()[0] == ROWS_A_BATCH
    finally:
        reader.close()
        writer.close()


READER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=5)
print("ready", flush=True)
deadline, reads, last = time.monotonic() + 30, 0, 0
while time.monotonic() < deadline:
    conn.execute("BEGIN")
    rows = conn.execute("SELECT count(*) FROM rows").fetchone()[0]
    total = conn.execute("SELECT rows FROM totals").fetchone()[0]
    batches = conn.execute("SELECT count(DISTINCT batch) FROM rows").fetchone()[0]
    conn.execute("COMMIT")
    assert rows == total == batches * 5, (rows, total, batches)
    assert rows >= last
    last, reads = rows, reads + 1
    if rows >= int(sys.argv[2]):
        break
print(reads, last)
"""


def test_a_reader_in_another_process_never_sees_part_of_a_commit(db):
    batches = 400
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(db), str(batches * ROWS_A_BATCH)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None
    assert reader.stdout.readline() == "ready\n"
    writer = Writer(str(db), PRAGMAS)
    checkpoints = sqlite3.connect(db, isolation_level=None, timeout=0.2)
    restarts = 0
    try:
        for number in range(batches):
            writer.run(batch(number))
            if number % 25 == 24:  # the WAL starts over: its header is written again
                busy, _, _ = checkpoints.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                restarts += not busy
    finally:
        checkpoints.close()
        writer.close()
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    reads, last = map(int, out.split())
    assert last == batches * ROWS_A_BATCH
    assert reads > 1  # it read while the writes went on
    assert restarts > 0


def test_a_transaction_larger_than_the_gathering_buffer(db):
    writer = Writer(str(db), PRAGMAS)
    big = os.urandom(600_000)  # five rows: 3 MB of pages, past the 128 KiB gathered at most
    try:
        writer.run(batch(0))
        writer.run(batch(1, data=big))
        writer.run(batch(2))
    finally:
        writer.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = conn.execute("SELECT data FROM rows WHERE batch = 1").fetchall()
        assert [row[0] for row in stored] == [big] * ROWS_A_BATCH
        assert conn.execute("SELECT rows FROM totals").fetchone()[0] == 3 * ROWS_A_BATCH


FULL_DISK = """
import json, os, resource, sys
from model_gateway.storage._batch import Writer
from tests.storage.test_wal_gather import PRAGMAS
path, wal = sys.argv[1], sys.argv[1] + "-wal"
big = [("INSERT INTO t (data) VALUES (?)", (b"x" * 127_000,))]  # 64 frames on a new table
writer = Writer(path, PRAGMAS)
writer.run([("INSERT INTO t (data) VALUES (x'00')", ())])  # the WAL's header, synced alone
start = os.path.getsize(wal)
# Room for 63 frames and the commit frame's header, the first gathered write, not for the
# commit frame's page that comes after it.
resource.setrlimit(resource.RLIMIT_FSIZE, (start + 63 * 2072 + 24, resource.RLIM_INFINITY))
try:
    outcome = writer.run(big)
except RuntimeError as exc:
    outcome = exc.args[0] & 0xFF
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
writer.run(big)  # the same commit with room: it writes where the failed one did
print(json.dumps([outcome, (os.path.getsize(wal) - start) // 2072]))
"""


def test_a_commit_whose_last_page_cannot_be_written_fails(tmp_path):
    """The commit frame's page comes once a full buffer was written out: it must still be
    written, and its failure reported, in the xWrite SQLite made for it."""
    path = tmp_path / "full.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "PRAGMA page_size = 2048; PRAGMA journal_mode = WAL;"
            "CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB);"
        )
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
        check=True,
    )
    outcome, frames = json.loads(done.stdout)
    assert frames == 64  # 63 gathered with the commit frame's header, its page the 64th
    assert outcome in {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR}  # not a success
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        lengths = conn.execute("SELECT length(data) FROM t ORDER BY id").fetchall()
        assert lengths == [(1,), (127_000,)]


KILLED_WRITER = """
import sys
from model_gateway.storage._batch import Writer
from tests.storage.test_wal_gather import PRAGMAS, batch
writer = Writer(sys.argv[1], PRAGMAS)
number = 0
while True:
    writer.run(batch(number))
    print(number, flush=True)
    number += 1
"""


def test_a_killed_writer_loses_no_commit_it_reported(db):
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(db)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert writer.stdout is not None
    reported = [int(writer.stdout.readline()) for _ in range(200)]
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=10)
    reported += [int(line) for line in writer.stdout.read().split()]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = {row[0] for row in conn.execute("SELECT DISTINCT batch FROM rows")}
        total = conn.execute("SELECT rows FROM totals").fetchone()[0]
    assert set(reported) <= stored
    assert total == len(stored) * ROWS_A_BATCH
