"""One gateway instance on PostgreSQL against one on SQLite (issue 40's goal: >= 0.6x its
req/s), and where a PostgreSQL request's time goes.

bench/scaleout.py's method without the two-instance side: metered chat at 32 connections,
rate limits on (the bench key's and project's rpm), the same mock upstream, wrk rounds
rotating over the sides. `--before GATEWAY` adds another checkout's `gateway` command on
a PostgreSQL database of its own, so a change is paired with what came before it in the
same run (`git worktree add /tmp/pg-old REV`, a venv there, `pip install -e .`).

After the rounds, one counted window per PostgreSQL side: the database's statistics
before and after (idle for a moment at both ends, so every backend has reported), what
one request cost in transactions (each autocommit statement is one: a round trip) and,
with `--functions` (track_functions on those databases; adds a little to their CPU), in
calls and self time of each SQL function, triggers included.

    python bench/postgres_instance.py [--rounds 5] [--seconds 4] [--functions]
        [--before /tmp/pg-old/.venv/bin/gateway]

Prints req/s and CPU ms per request (the gateway, the PostgreSQL backends of its own
database) with the ratios to SQLite, then the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import asyncpg
from gateway_target import start_mock
from load import run_wrk
from run import CHAT
from scaleout import WARMUP_S, Side, load, missing, postgresql, report, sqlite

SETTLE_S = 2.5  # idle before a statistics snapshot: backends report within a second idle
STATS = (
    "SELECT xact_commit + xact_rollback AS transactions, tup_inserted, tup_updated,"
    " tup_deleted FROM pg_stat_database WHERE datname = current_database()"
)
FUNCTIONS = "SELECT funcname, calls, self_time FROM pg_stat_user_functions"


async def _snapshot(database_url: str) -> dict[str, float]:
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(STATS)
        found = {name: float(value) for name, value in row.items()}
        for name, calls, self_ms in await conn.fetch(FUNCTIONS):
            found[f"{name} calls"] = float(calls)
            found[f"{name} self ms"] = float(self_ms)
        return found
    finally:
        await conn.close()


def counted(args, side: Side, body: Path, raw) -> list[str]:
    """One window of load between two snapshots of the side's database statistics: per
    request, what changed."""
    assert side.database_url is not None
    time.sleep(SETTLE_S)
    before = asyncio.run(_snapshot(side.database_url))
    result = run_wrk(
        side.url + CHAT.path, args.connections, args.seconds, "post.lua", [side.key, str(body)], raw
    )
    time.sleep(SETTLE_S)
    after = asyncio.run(_snapshot(side.database_url))
    requests = max(result.requests, 1)
    lines = [f"- {side.name}: {result.requests:,} requests"]
    for name, value in after.items():
        change = (value - before.get(name, 0.0)) / requests
        if change:
            lines.append(f"  - {name}: {change:.3f} a request")
    return lines


def paired(sides: list[Side]) -> str:
    """Each round's ratios (round by round: the machine's noise moves both alike) of the
    PostgreSQL instance to SQLite and, with --before, to the other checkout."""
    lines = []
    for label, base in (("SQLite", sides[0]), ("before", sides[2] if len(sides) > 2 else None)):
        if base is None:
            continue
        rps = [a.rps / b.rps for a, b in zip(sides[1].rounds, base.rounds, strict=True)]
        cpu = [
            sum(a.cpu_ms.values()) / sum(b.cpu_ms.values())
            for a, b in zip(sides[1].rounds, base.rounds, strict=True)
        ]
        lines.append(
            f"- PostgreSQL ÷ {label}, round by round: req/s {statistics.median(rps):.2f}x"
            f" ({', '.join(f'{r:.2f}' for r in rps)}), CPU a request"
            f" {statistics.median(cpu):.2f}x ({', '.join(f'{c:.2f}' for c in cpu)})"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--gateway", type=Path, default=Path(sys.executable).with_name("gateway"))
    parser.add_argument("--before", type=Path, help="another checkout's gateway command")
    parser.add_argument("--functions", action="store_true", help="count SQL functions' calls")
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "GATEWAY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    args.haproxy = "unused"  # scaleout.missing() asks for it; one instance needs none
    args.settings = {"track_functions": "'all'"} if args.functions else None
    absent = missing(args)
    if absent is not None:
        print(f"\nPostgreSQL instance row skipped: {absent}.")
        return
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        body = folder / "chat.json"
        body.write_bytes(CHAT.data)
        mock = start_mock(folder)
        stack.callback(mock.stop)
        upstream = mock.url + "/v1"
        sides = [
            sqlite(stack, args, folder, upstream),
            postgresql(stack, args, folder / "pg", upstream, 1),
        ]
        if args.before is not None:
            sides.append(
                postgresql(stack, args, folder / "pg-before", upstream, 1, args.before, " (before)")
            )
        counts: list[str] = []
        with (folder / "wrk.raw").open("w") as raw:
            for side in sides:
                load(args, side, body, raw, WARMUP_S, mock.pid)
            for _ in range(args.rounds):
                for side in sides:
                    load(args, side, body, raw, args.seconds, mock.pid)
            for side in sides[1:]:
                counts += counted(args, side, body, raw)
    print(report(args, sides))
    print("\n" + paired(sides))
    print("\nPer request, from each PostgreSQL database's statistics (one counted window):\n")
    print("\n".join(counts))


if __name__ == "__main__":
    main()
