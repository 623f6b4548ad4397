"""Reserve + settle throughput of each storage backend, through the Storage interface.

Each worker loops: reserve a hold, settle it (cost below the hold). It reports pairs per
second, the latency of a pair (p50, p99) and this process's CPU per pair; for PostgreSQL
the server's CPU too (its backends are other processes). `--processes 2` runs the workers
in two processes with a handle each (two gateway instances; PostgreSQL only makes sense
there: SQLite serves one process).

    .venv/bin/python bench/storage_backends.py                # both backends, defaults
    .venv/bin/python bench/storage_backends.py --seconds 10 --concurrency 1,16,64

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
import statistics
import tempfile
import time
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from model_gateway.storage import ProjectRecord, ReceiptRecord, ReservationRecord, open_storage
from model_gateway.storage.base import KeyRecord

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


async def load(url: str, accounts, concurrency: int, seconds: float, worker_offset: int):
    storage = await open_storage(url)
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def worker(n: int) -> None:
        pid, kid = accounts[(worker_offset + n) % len(accounts)]
        while time.monotonic() < stop:
            started = time.perf_counter()
            hold = ReservationRecord(
                id="rsv_" + secrets.token_hex(10),
                project_id=pid,
                key_id=kid,
                amount=1_000,
                month=MONTH,
                owner="bench:1:1",
                lease_until=2**40,
                created_at=0,
            )
            await storage.reserve(hold)
            settled = await storage.settle(
                ReceiptRecord(
                    id="rcpt_" + secrets.token_hex(10),
                    reservation_id=hold.id,
                    project_id=pid,
                    key_id=kid,
                    request_id="req_bench",
                    kind="inference",
                    endpoint="/v1/chat/completions",
                    model_or_runtime="echo-1",
                    status="succeeded",
                    usage={"input_tokens": 10, "output_tokens": 20},
                    cost=400,
                    month=MONTH,
                    created_at=time.time_ns() // 1000,
                    request_sha256="0" * 64,
                    response_sha256="0" * 64,
                )
            )
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
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    project_counts = [int(p) for p in args.projects.split(",")]

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
