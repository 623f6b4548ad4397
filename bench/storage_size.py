"""Storage per request: the SQLite file after a checkpoint, divided by the requests served.

Drives metered requests through a real gateway (chat and streamed chat, alternating, at
--connections with wrk, to the mock upstream) until at least --requests are receipted and
logged, stops it, folds the WAL into the file (wal_checkpoint(TRUNCATE)) and prints bytes
per request: the whole file, and each table and index (`dbstat`).

    .venv/bin/python bench/storage_size.py                    # 20,000 requests
    .venv/bin/python bench/storage_size.py --requests 50000
    .venv/bin/python bench/storage_size.py --measure data/gateway.db   # an existing file

Goal (issue 14): at most 400 bytes a request, indexes included.
"""

from __future__ import annotations

import argparse
import io
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gateway_target import metered_gateway
from load import run_wrk, wrk_version
from procs import Server, StartError
from run import CHAT, CHAT_STREAM, log

GOAL_BYTES = 400
CHUNK_S = 5  # wrk runs this long between two counts of the receipts


@dataclass(frozen=True)
class Size:
    file_bytes: int
    receipts: int
    objects: list[tuple[str, str, int, int]]  # (name, table it belongs to, bytes, payload)

    @property
    def per_request(self) -> float:
        return self.file_bytes / max(1, self.receipts)


def checkpoint(db: Path) -> None:
    """Fold the WAL into the database file and empty it (the server has stopped)."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def measure(db: Path) -> Size:
    """The file's size and each table's and index's pages, as the file stands now."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        receipts = conn.execute("SELECT count(*) FROM receipts").fetchone()[0]
        objects = conn.execute(
            "SELECT d.name, COALESCE(m.tbl_name, d.name), SUM(d.pgsize), SUM(d.payload)"
            " FROM dbstat d LEFT JOIN sqlite_schema m ON m.name = d.name"
            " GROUP BY d.name ORDER BY SUM(d.pgsize) DESC"
        ).fetchall()
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    finally:
        conn.close()
    return Size(page * pages, receipts, objects)


def render(size: Size) -> str:
    n = max(1, size.receipts)
    out = io.StringIO()
    out.write(
        f"{size.receipts:,} receipts, file {size.file_bytes / 2**20:.1f} MiB:"
        f" {size.per_request:.0f} bytes a request (goal <= {GOAL_BYTES}:"
        f" {'met' if size.per_request <= GOAL_BYTES else 'NOT met'})\n\n"
        "| table or index | of table | bytes/request | payload bytes/request |\n"
        "|---|---|---:|---:|\n"
    )
    for name, table, pgsize, payload in size.objects:
        if pgsize / n >= 0.5:
            out.write(f"| {name} | {table} | {pgsize / n:.1f} | {payload / n:.1f} |\n")
    return out.getvalue()


def logged(db: Path) -> tuple[int, int]:
    """(receipts, receipts in the log) as a reader sees them now."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute(
            "SELECT (SELECT count(*) FROM receipts),"
            " (SELECT count(*) FROM log_entries) + (SELECT count(*) FROM log_leaves)"
        ).fetchone()
    finally:
        conn.close()


def drive(server: Server, key: str, db: Path, requests: int, connections: int, folder: Path):
    """Metered chat and streamed chat until `requests` receipts are logged."""
    args = [key]
    for kind in (CHAT, CHAT_STREAM):
        body = folder / f"{kind.name.replace(' ', '-')}.json"
        body.write_bytes(kind.data)
        args += [kind.path, str(body)]
    with (folder / "wrk.raw").open("w") as raw:
        while logged(db)[0] < requests:
            result = run_wrk(server.url + "/", connections, CHUNK_S, "mix.lua", args, raw)
            if result.errors or result.bad_status:
                raise RuntimeError(f"{result.errors} errors, {result.bad_status} bad answers")
            log(f"{logged(db)[0]:,} receipts ({result.rps:,.0f} req/s)")
    deadline = time.monotonic() + 30
    while (counts := logged(db))[1] < counts[0] and time.monotonic() < deadline:
        time.sleep(0.5)  # the log appends within about 250 ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--measure", type=Path, help="only measure this database file")
    parser.add_argument("--gateway", type=Path, default=Path(sys.executable).parent / "gateway")
    args = parser.parse_args()
    if args.measure:
        checkpoint(args.measure)
        print(render(measure(args.measure)))
        return 0
    if wrk_version() is None:
        log("wrk is not installed: apt-get install -y wrk")
        return 2
    with tempfile.TemporaryDirectory(prefix="gateway-size-") as name:
        folder = Path(name)
        try:
            with metered_gateway(args.gateway, folder) as (server, key, db):
                drive(server, key, db, args.requests, args.connections, folder)
        except (StartError, RuntimeError) as error:
            log(f"aborted: {error}")
            return 1
        checkpoint(db)
        print(render(measure(db)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
