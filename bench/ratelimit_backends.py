"""What a rate-limit decision costs with each limiter: in-process GCRA, PostgreSQL
(`rate_limit_take`, one round trip) and Redis (one EVALSHA), through the gateway's own
classes. Each caller loops acquire() over a request's two buckets (one project shared by
every caller, a key of its own: the hot row of a busy project), with limits that never
refuse. Rounds alternate the limiters, so what else the machine does hits each alike;
the table keeps each one's median round, with this process's CPU per call and the
server's (the PostgreSQL backends of the bench's database; a redis-server of its own).

    .venv/bin/python bench/ratelimit_backends.py                 # 5 rounds of 3 s, 1 and 32 callers
    .venv/bin/python bench/ratelimit_backends.py --seconds 5 --concurrency 1,8,32

PostgreSQL: a database of its own on --postgres, dropped at the end. Redis: a redis-server
it starts on a free port and stops. On a 2-core machine the client, the
server and everything else share two cores: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import statistics
import subprocess
import time
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import redis

from model_gateway.gateway.ratelimit.limiters import LocalGcra
from model_gateway.gateway.ratelimit.postgres_gcra import PostgresGcra
from model_gateway.gateway.ratelimit.redis_gcra import RedisGcra
from model_gateway.gateway.ratelimit.store_health import StoreHealth
from model_gateway.storage import open_storage

NEVER_REFUSES = 100_000_000  # rpm: an interval of 1 µs


def ticks(pids: list[int]) -> dict[int, int]:
    """CPU ticks (user + system) of each of these processes still alive."""
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        found[pid] = sum(int(x) for x in stat[stat.rindex(")") + 2 :].split()[11:13])
    return found


class PostgresBackends:
    """The server processes serving the bench database, and no other database's."""

    def __init__(self, admin_url: str, database: str) -> None:
        self.admin_url, self.database = admin_url, database

    async def pids(self) -> list[int]:
        conn = await asyncpg.connect(self.admin_url)
        try:
            rows = await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1", self.database
            )
        finally:
            await conn.close()
        return [row["pid"] for row in rows]


class OwnRedis:
    """A redis-server of the bench's own on a free port: its CPU is the bench's alone."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        client.close()

    async def pids(self) -> list[int]:
        return [self.process.pid]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


async def measure(limiter, server, callers: int, seconds: float) -> dict:
    project = f"prj_{secrets.token_hex(4)}"
    stop = time.monotonic() + seconds
    calls = 0

    async def caller() -> None:
        nonlocal calls
        key = f"key_{secrets.token_hex(4)}"
        buckets = [(project, NEVER_REFUSES, 1), (key, NEVER_REFUSES, 1)]  # (name, limit, units)
        while time.monotonic() < stop:
            assert (await limiter.acquire(buckets)).wait_s == 0
            calls += 1

    before = ticks(await server.pids()) if server else {}
    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.gather(*(caller() for _ in range(callers)))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    after = ticks(await server.pids()) if server else {}
    used = sum(t - before.get(pid, 0) for pid, t in after.items())
    server_s = used / os.sysconf("SC_CLK_TCK")
    return {
        "calls_per_s": calls / wall,
        "us_per_call": 1e6 * wall * callers / calls,  # a caller's wait for one decision
        "client_cpu_us": 1e6 * cpu / calls,
        "server_cpu_us": 1e6 * server_s / calls if server else None,
    }


async def bench(args, pg_url: str, backends, own_redis) -> list[tuple[str, int, dict]]:
    storage = await open_storage(pg_url)
    limiters = {
        "in-process": (LocalGcra(), None),
        "postgresql": (PostgresGcra(storage, StoreHealth("PostgreSQL")), backends),
        "redis": (RedisGcra(own_redis.url, "bench:", StoreHealth("Redis")), own_redis),
    }
    chosen = {name: limiters[name] for name in args.limiters.split(",")}
    rounds: dict[tuple[str, int], list[dict]] = {}
    try:
        for _ in range(args.rounds):
            for callers in args.concurrency:
                for name, (limiter, server) in chosen.items():
                    result = await measure(limiter, server, callers, args.seconds)
                    rounds.setdefault((name, callers), []).append(result)
    finally:
        for limiter, _ in limiters.values():
            await limiter.close()
        await storage.close()
    rows = []
    for (name, callers), results in rounds.items():
        median = statistics.median(r["calls_per_s"] for r in results)
        rows.append((name, callers, next(r for r in results if r["calls_per_s"] == median)))
    return rows


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
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="odd: the median is a round")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--limiters", default="in-process,postgresql,redis")
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "GATEWAY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    name = f"gateway_bench_{secrets.token_hex(4)}"
    pg_url = urlunsplit(urlsplit(args.postgres)._replace(path=f"/{name}"))
    _admin(args.postgres, f'CREATE DATABASE "{name}"')
    own_redis = OwnRedis()
    try:
        rows = asyncio.run(bench(args, pg_url, PostgresBackends(args.postgres, name), own_redis))
    finally:
        own_redis.stop()
        _admin(args.postgres, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"\n{args.rounds} alternating rounds of {args.seconds:g} s; each row its median round\n")
    print("| limiter | callers | calls/s | µs per call | client CPU µs/call | server CPU µs/call |")
    print("|---|---:|---:|---:|---:|---:|")
    for limiter, callers, r in sorted(rows, key=lambda row: (row[1], row[0])):
        server = "-" if r["server_cpu_us"] is None else f"{r['server_cpu_us']:.0f}"
        print(
            f"| {limiter} | {callers} | {r['calls_per_s']:,.0f} | {r['us_per_call']:.1f}"
            f" | {r['client_cpu_us']:.1f} | {server} |"
        )


if __name__ == "__main__":
    main()
