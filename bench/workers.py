"""`gateway serve --workers 2` against one worker (docs/deployment.md, "Every core of one
box"): bench/paired.py's alternating wrk rounds, chat at 32 connections by default, CPU
per request counted over the parent and its workers. The goal: CPU per request with two
workers at most 1.1x one worker's.

    python bench/workers.py [--rounds 6 --seconds 4 --connections 32 ...]  # paired.py's options
    python bench/workers.py --limiter   # the workers' rate limiter against a SQLite table

`--limiter` times one take of two buckets (a key's and a project's rpm) in the table the
workers map (gateway/ratelimit/shared_gcra.py) and in a SQLite file in WAL mode with
synchronous off, one IMMEDIATE transaction per take: the choice the shared limiter made.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from pathlib import Path

TAKES = 20_000


def limiter() -> None:
    from model_gateway.gateway.ratelimit.shared_gcra import SharedGcra, create_table

    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:  # where the workers map it
        table = Path(tmp) / "ratelimit.buckets"
        create_table(table)
        shared = SharedGcra(table)
        buckets = [("key:k1", 10**9, 1), ("project:p1", 10**9, 1)]
        started = time.perf_counter()
        for _ in range(TAKES):
            shared.take(buckets)
        mapped_us = (time.perf_counter() - started) / TAKES * 1e6

        conn = sqlite3.connect(Path(tmp) / "buckets.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("CREATE TABLE b (name TEXT PRIMARY KEY, at INTEGER, level INTEGER)")
        started = time.perf_counter()
        for i in range(TAKES):
            conn.execute("BEGIN IMMEDIATE")
            for name, _, _ in buckets:
                conn.execute("SELECT at, level FROM b WHERE name = ?", (name,)).fetchone()
                conn.execute(
                    "INSERT INTO b VALUES (?, ?, 0) ON CONFLICT (name) DO UPDATE"
                    " SET at = excluded.at, level = level + 60000",
                    (name, i),
                )
            conn.execute("COMMIT")
        sqlite_us = (time.perf_counter() - started) / TAKES * 1e6
    print(f"one take of two buckets: mapped table {mapped_us:.1f} µs, SQLite {sqlite_us:.1f} µs")


def main() -> None:
    if "--limiter" in sys.argv:
        limiter()
        return
    sys.path.insert(0, str(Path(__file__).parent))
    import paired

    sys.argv = [
        "paired.py",
        "--name-a",
        "1 worker",
        "--name-b",
        "2 workers",
        "--extra-b",
        "workers = 2",
        *sys.argv[1:],
    ]
    paired.main()


if __name__ == "__main__":
    main()
