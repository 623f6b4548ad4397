"""Reserve + settle throughput of each storage backend, through the Storage interface.

Each worker loops: reserve a hold, settle it (cost below the hold). It reports pairs per
second, the latency of a pair (p50, p99) and this process's CPU per pair; for PostgreSQL
the server's CPU too (its backends are other processes). `--processes 2` runs the workers
in two processes with a handle each (two gateway instances; PostgreSQL only makes sense
there: SQLite serves one process).

    .venv/bin/python bench/storage_backends.py                # both backends, defaults
    .venv/bin/python bench/storage_backends.py --seconds 10 --concurrency 1,16,64

SQLite on a large database: `--prefill 1000000` first settles that many receipts (another
project, through the same API) and checkpoints, then measures on a copy of that file for
each `--sqlite-cache` variant (page cache KiB : mmap bytes), beside the empty database:

    .venv/bin/python bench/storage_backends.py --backends sqlite --prefill 0,1000000 \
        --sqlite-cache 2000:0,16384:0,16384:1073741824

PostgreSQL: a database of its own is created on the server of --postgres (default
postgresql://postgres@127.0.0.1:5432/postgres) and dropped at the end. On a small shared
machine the numbers measure contention as much as speed: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import secrets
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from model_gateway.storage import ProjectRecord, ReceiptRecord, ReservationRecord, open_storage
from model_gateway.storage.base import KeyRecord
from model_gateway.storage.sqlite import connection as sqlite_backend  # _pragmas reads it

MONTH = "2026-11"


def _postgres_ticks() -> int:
    """CPU ticks (user + system) of every postgres process on this machine."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith("postgres"):
            fields = stat[stat.rindex(")") + 2 :].split()
            # utime, stime, and the children's: ended backends are counted by the postmaster
            total += sum(int(x) for x in fields[11:15])
    return total


async def setup(url: str, projects: int) -> list[tuple[str, str]]:
    storage = await open_storage(url)
    accounts = []
    try:
        for _ in range(projects):
            pid, kid = f"prj_{secrets.token_hex(6)}", f"key_{secrets.token_hex(6)}"
            await storage.create_project(ProjectRecord(id=pid, name="bench"))
            await storage.create_key(
                KeyRecord(
                    id=kid,
                    prefix=f"proj_live_{secrets.token_hex(6)}",
                    key_hash=b"h",
                    project_id=pid,
                    scopes=frozenset({"inference"}),
                    monthly_limit=10**15,
                )
            )
            await storage.add_credit(pid, 10**15, MONTH)
            accounts.append((pid, kid))
    finally:
        await storage.close()
    return accounts


def _pair(pid: str, kid: str) -> tuple[ReservationRecord, ReceiptRecord]:
    """A hold and the receipt that settles it, with ids and digests as the gateway makes them."""
    hold = ReservationRecord(
        id="rsv_" + secrets.token_hex(12),
        project_id=pid,
        key_id=kid,
        amount=1_000,
        month=MONTH,
        owner="bench:1:1",
        lease_until=2**40,
        created_at=0,
    )
    salt = secrets.token_hex(16)
    receipt = ReceiptRecord(
        id="rcpt_" + secrets.token_hex(12),
        reservation_id=hold.id,
        project_id=pid,
        key_id=kid,
        request_id="req_" + secrets.token_hex(12),
        kind="inference",
        endpoint="/v1/chat/completions",
        model_or_runtime="echo-1",
        status="succeeded",
        usage={"input_tokens": 10, "output_tokens": 20},
        cost=400,
        month=MONTH,
        created_at=time.time_ns() // 1000,
        request_sha256=secrets.token_hex(32),
        response_sha256=secrets.token_hex(32),
        request_salt=salt,
        response_salt=salt,
        request_commitment=secrets.token_hex(32),
        usage_source="provider",
        provider="echo",
    )
    return hold, receipt


async def prefill(url: str, receipts: int) -> None:
    """`receipts` settled receipts of a project of their own, 2,000 pairs at a time."""
    [(pid, kid)] = await setup(url, 1)
    storage = await open_storage(url)
    try:

        async def pair() -> None:
            hold, receipt = _pair(pid, kid)
            await storage.reserve(hold)
            assert await storage.settle(receipt)

        for done in range(0, receipts, 2_000):
            await asyncio.gather(*(pair() for _ in range(min(2_000, receipts - done))))
            if done % 100_000 == 0:
                print(f"prefill: {done:,} receipts", flush=True)
    finally:
        await storage.close()
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


async def load(url: str, accounts, concurrency: int, seconds: float, worker_offset: int):
    storage = await open_storage(url)
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def worker(n: int) -> None:
        pid, kid = accounts[(worker_offset + n) % len(accounts)]
        while time.monotonic() < stop:
            started = time.perf_counter()
            hold, receipt = _pair(pid, kid)
            await storage.reserve(hold)
            settled = await storage.settle(receipt)
            assert settled
            latencies.append(time.perf_counter() - started)

    cpu = time.process_time()
    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    cpu = time.process_time() - cpu
    await storage.close()
    return latencies, cpu


def _process_main(url, accounts, concurrency, seconds, offset, queue) -> None:
    queue.put(asyncio.run(load(url, accounts, concurrency, seconds, offset)))


def run_case(url: str, accounts, concurrency: int, seconds: float, processes: int) -> dict:
    ticks = _postgres_ticks()
    wall = time.monotonic()
    if processes == 1:
        results = [asyncio.run(load(url, accounts, concurrency, seconds, 0))]
    else:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        per = max(1, concurrency // processes)
        procs = [
            ctx.Process(target=_process_main, args=(url, accounts, per, seconds, i * per, queue))
            for i in range(processes)
        ]
        for p in procs:
            p.start()
        results = [queue.get() for _ in procs]
        for p in procs:
            p.join()
    wall = time.monotonic() - wall
    latencies = [x for lat, _ in results for x in lat]
    cpu = sum(c for _, c in results)
    server_s = (_postgres_ticks() - ticks) / os.sysconf("SC_CLK_TCK")
    pairs = len(latencies)
    latencies.sort()
    return {
        "pairs_per_s": pairs / seconds,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (pairs - 1))],
        "client_cpu_us": 1e6 * cpu / pairs,
        "server_cpu_us": 1e6 * server_s / pairs,
        "wall_s": wall,
    }


def _admin(admin_url: str, sql: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(admin_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--projects", default="1,16", help="hot single project vs spread")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "GATEWAY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument(
        "--async-commit",
        action="store_true",
        help="PostgreSQL: synchronous_commit = off on the bench database (what fsync costs)",
    )
    parser.add_argument(
        "--prefill", help="SQLite: receipts already in the database, e.g. 0,1000000"
    )
    parser.add_argument(
        "--sqlite-cache",
        default=f"{sqlite_backend.CACHE_SIZE_KIB}:{sqlite_backend.MMAP_SIZE_BYTES}",
        help="with --prefill: page cache KiB:mmap bytes variants, comma-separated",
    )
    parser.add_argument("--rounds", type=int, default=2, help="with --prefill: alternating rounds")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    project_counts = [int(p) for p in args.projects.split(",")]
    if args.prefill:
        with tempfile.TemporaryDirectory() as folder:
            sqlite_growth(args, Path(folder), concurrencies)
        return

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        name = f"gateway_bench_{secrets.token_hex(4)}"
        parts = urlsplit(args.postgres)
        pg_url = urlunsplit(parts._replace(path=f"/{name}"))
        if "postgresql" in args.backends:
            _admin(args.postgres, f'CREATE DATABASE "{name}"')
            if args.async_commit:
                _admin(args.postgres, f'ALTER DATABASE "{name}" SET synchronous_commit = off')
        try:
            for backend in args.backends.split(","):
                for projects in project_counts:
                    url = (
                        f"sqlite:///{folder}/bench-{projects}.db" if backend == "sqlite" else pg_url
                    )
                    accounts = asyncio.run(setup(url, projects))
                    process_counts = [1] if backend == "sqlite" else [1, 2]
                    for processes in process_counts:
                        for concurrency in concurrencies:
                            if concurrency < processes:
                                continue
                            result = run_case(url, accounts, concurrency, args.seconds, processes)
                            row = (backend, projects, processes, concurrency, result)
                            rows.append(row)
                            print(_format(row), flush=True)
        finally:
            if "postgresql" in args.backends:
                _admin(args.postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    print()
    print(_HEADER)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(_format(row))


def sqlite_growth(args: argparse.Namespace, folder: Path, concurrencies: list[int]) -> None:
    """Reserve + settle on an empty and on prefilled SQLite databases, for each page cache
    and mmap variant, rounds alternating so that drifts of the machine hit all alike."""
    bases = {}
    for receipts in (int(n) for n in args.prefill.split(",")):
        bases[receipts] = folder / f"prefilled-{receipts}.db"
        asyncio.run(prefill(f"sqlite:///{bases[receipts]}", receipts))
        print(f"prefilled {receipts:,}: {bases[receipts].stat().st_size / 2**20:.0f} MiB")
    variants = [tuple(int(x) for x in v.split(":")) for v in args.sqlite_cache.split(",")]
    results: dict[tuple[int, int, int, int], list[dict]] = {}
    for _ in range(args.rounds):
        for receipts, base in bases.items():
            for cache_kib, mmap_bytes in variants:
                sqlite_backend.CACHE_SIZE_KIB, sqlite_backend.MMAP_SIZE_BYTES = (
                    cache_kib,
                    mmap_bytes,
                )
                run = folder / "run.db"
                shutil.copy(base, run)
                url = f"sqlite:///{run}"
                accounts = asyncio.run(setup(url, 1))
                for concurrency in concurrencies:
                    r = run_case(url, accounts, concurrency, args.seconds, 1)
                    results.setdefault((receipts, cache_kib, mmap_bytes, concurrency), []).append(r)
                    pairs = r["pairs_per_s"]
                    print(f"{receipts:>9,} cache {cache_kib} KiB mmap {mmap_bytes}"
                          f" c{concurrency}: {pairs:.0f} pairs/s", flush=True)  # fmt: skip
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{run}{suffix}").unlink(missing_ok=True)
    print("\n| receipts before | cache KiB | mmap bytes | concurrency | pairs/s (median)"
          " | p50 ms | client CPU µs/pair |\n|---:|---:|---:|---:|---:|---:|---:|")  # fmt: skip
    for (receipts, cache_kib, mmap_bytes, concurrency), runs in results.items():
        r = sorted(runs, key=lambda x: x["pairs_per_s"])[len(runs) // 2]
        cells = [f"{receipts:,}", cache_kib, mmap_bytes, concurrency, f"{r['pairs_per_s']:.0f}",
                 f"{r['p50_ms']:.2f}", f"{r['client_cpu_us']:.0f}"]  # fmt: skip
        print("| " + " | ".join(str(c) for c in cells) + " |")


_HEADER = (
    "| backend | projects | processes | concurrency | pairs/s | p50 ms | p99 ms"
    " | client CPU µs/pair | server CPU µs/pair |"
)


def _format(row) -> str:
    backend, projects, processes, concurrency, r = row
    server = f"{r['server_cpu_us']:.0f}" if backend == "postgresql" else "-"
    return (
        f"| {backend} | {projects} | {processes} | {concurrency} | {r['pairs_per_s']:.0f}"
        f" | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['client_cpu_us']:.0f} | {server} |"
    )


if __name__ == "__main__":
    main()
