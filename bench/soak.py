"""Soak: full metered load on a fresh gateway for N minutes, one line a minute.

Chat and streamed chat, each at 32 connections with its own wrk (as bench/run.py loads
them), against the gateway over the mock upstream, metering and the log on, on a fresh
SQLite database. Every minute: req/s per scenario, the gateway's RSS (/proc VmRSS) and
the database's size (file + WAL). At the end: bytes per request after a checkpoint and
the targets of issue 14: RSS within ±5 MiB of minute 1's from then on, the last minute's
req/s at least 0.9x the first's, at most 400 bytes a request.

With `--postgres ADMIN_URL` the gateway stores in a new PostgreSQL database (dropped at
the end; the control's fresh gateway gets one of its own): the column is then the
database's size (`pg_database_size`), and bytes a request are reported beside the
largest tables, without a verdict (the 400-byte goal is the SQLite file's). RSS is the
gateway's own, not the PostgreSQL server's.

The first and the last minute are ten minutes apart, and these VMs change speed by more
than 10% in that time. So a control follows the soak: a fresh gateway (its own mock, an
empty database) and the soaked one take the same load in turn, `--control-rounds` rounds
of 20 s, the order swapped every round. The soaked gateway's req/s over the fresh one's
is what its history costs, whatever the machine did meanwhile.

    .venv/bin/python bench/soak.py              # what `make soak` runs: 10 minutes
    .venv/bin/python bench/soak.py --minutes 2  # a short trial
    .venv/bin/python bench/soak.py --postgres postgresql://postgres@127.0.0.1:5432/postgres

Two cores are shared by wrk (two), the mock and the gateway: compare minutes within one
run, not runs on different days.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import asyncpg
from gateway_target import metered_gateway
from load import BENCH_DIR, WRK_THREADS, wrk_version
from procs import Server, StartError, memory_kib
from run import CHAT, CHAT_STREAM, log
from scaleout import database
from storage_size import GOAL_BYTES, checkpoint, measure
from storage_size import render as render_size

CONNECTIONS = 32
RSS_BAND_MIB = 5
RPS_KEEP = 0.9
SCENARIOS = (CHAT, CHAT_STREAM)
CONTROL_S = 20
WARM_UP_S = 3


def wrk(url: str, auth: str, body: Path, seconds: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["wrk", f"-t{WRK_THREADS}", f"-c{CONNECTIONS}", f"-d{seconds}s", "--timeout", "10s",
         "-s", "post.lua", url, "--", auth, str(body)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=BENCH_DIR,
    )  # fmt: skip


def requests_of(output: str) -> tuple[int, int]:
    """(requests, errors + bad answers) from post.lua's BENCH line."""
    line = next((x for x in output.splitlines() if x.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result: {output.strip()[-200:]}")
    stats = json.loads(line.removeprefix("BENCH "))
    return stats["requests"], stats["errors"] + stats["bad_status"]


def load(server: Server, key: str, bodies: list[Path], seconds: int) -> list[tuple[int, int]]:
    """Every scenario at once against `server` for `seconds`: (requests, errors) of each."""
    runs = [
        wrk(server.url + kind.path, key, body, seconds)
        for kind, body in zip(SCENARIOS, bodies, strict=True)
    ]
    counts = [requests_of(run.communicate()[0]) for run in runs]
    if server.proc.poll() is not None:
        raise RuntimeError("the gateway exited under load")
    return counts


def control(soaked: Server, key: str, fresh: Server, fresh_key: str, bodies: list[Path],
            rounds: int) -> list[float]:  # fmt: skip
    """The soaked gateway's req/s over a fresh one's, round by round (order swapped)."""
    load(fresh, fresh_key, bodies, WARM_UP_S)
    ratios = []
    for n in range(rounds):
        pair = {"soaked": (soaked, key), "fresh": (fresh, fresh_key)}
        order = list(pair) if n % 2 == 0 else list(pair)[::-1]
        served = {name: sum(r for r, _ in load(*pair[name], bodies, CONTROL_S)) for name in order}
        ratios.append(served["soaked"] / served["fresh"])
    return ratios


class SQLiteFile:
    """The soaked database as a SQLite file (and its WAL)."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def mib(self) -> float:
        files = (self.db, self.db.with_name(self.db.name + "-wal"))
        return sum(p.stat().st_size for p in files if p.exists()) / 2**20

    def final(self) -> tuple[str, float | None]:
        """Its report once the gateway stopped, and bytes a request to judge (None: none)."""
        checkpoint(self.db)
        size = measure(self.db)
        return render_size(size), size.per_request


class PostgresDatabase:
    """The soaked database as a PostgreSQL database."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def _query(self, sql: str) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.url)
        try:
            return await conn.fetch(sql)
        finally:
            await conn.close()

    def mib(self) -> float:
        rows = asyncio.run(self._query("SELECT pg_database_size(current_database()) AS size"))
        return int(rows[0]["size"]) / 2**20

    def final(self) -> tuple[str, float | None]:
        receipts = asyncio.run(self._query("SELECT count(*) AS n FROM receipts"))[0]["n"]
        per = max(1, receipts)
        tables = asyncio.run(
            self._query(
                "SELECT relname, pg_total_relation_size(oid) AS size FROM pg_class"
                " WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace"
                " ORDER BY size DESC LIMIT 8"
            )
        )
        mib = self.mib()
        lines = [
            f"{receipts:,} receipts, database {mib:.1f} MiB:"
            f" {mib * 2**20 / per:.0f} bytes a request (PostgreSQL's pages and tuple"
            " headers; the 400-byte goal is measured on SQLite)\n",
            "| table (indexes and TOAST included) | bytes/request |",
            "|---|---:|",
            *(f"| {t['relname']} | {t['size'] / per:.0f} |" for t in tables),
        ]
        return "\n".join(lines), None


def fresh_store(stack: ExitStack, postgres: str | None) -> tuple[str, str | None]:
    """Config lines naming a new PostgreSQL database (dropped with `stack`), or none for
    the default SQLite file; and that database's URL."""
    if postgres is None:
        return "", None
    url = stack.enter_context(database(postgres))
    return f'[storage]\nurl = "{url}"', url


def rss_mib(pid: int) -> float:
    return memory_kib(pid) / 1024


def load_average() -> str:
    """The machine's 1-minute load average: other work on the two cores shows here."""
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--gateway", type=Path, default=Path(sys.executable).parent / "gateway")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "soak.md")
    parser.add_argument("--control-rounds", type=int, default=4)
    parser.add_argument("--postgres", metavar="ADMIN_URL", help="store in PostgreSQL (above)")
    args = parser.parse_args()
    if wrk_version() is None:
        log("wrk is not installed: apt-get install -y wrk")
        return 2
    lines = [
        f"Soak {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: chat and chat stream, "
        f"{CONNECTIONS} connections each, {args.minutes} min,"
        f" fresh {'PostgreSQL' if args.postgres else 'SQLite'} database\n",
        "| minute | chat req/s | chat stream req/s | RSS MiB | DB MiB | errors | load avg |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    rows: list[tuple[int, list[float], float]] = []
    with tempfile.TemporaryDirectory(prefix="gateway-soak-") as name, ExitStack() as stores:
        folder = Path(name)
        try:
            extra, url = fresh_store(stores, args.postgres)
            with metered_gateway(args.gateway, folder, extra) as (server, key, db):
                store = SQLiteFile(db) if url is None else PostgresDatabase(url)
                bodies = []
                for kind in SCENARIOS:
                    bodies.append(folder / f"{kind.name.replace(' ', '-')}.json")
                    bodies[-1].write_bytes(kind.data)
                lines.append(
                    f"| 0 (idle) | | | {rss_mib(server.pid):.1f} | {store.mib():.1f} | |"
                    f" {load_average()} |"
                )
                print(lines[-1], flush=True)
                for minute in range(1, args.minutes + 1):
                    counts = load(server, key, bodies, 60)
                    rps = [n / 60 for n, _ in counts]
                    rss = rss_mib(server.pid)
                    rows.append((minute, rps, rss))
                    lines.append(
                        f"| {minute} | {rps[0]:,.0f} | {rps[1]:,.0f} | {rss:.1f}"
                        f" | {store.mib():.1f} | {sum(e for _, e in counts)} | {load_average()} |"
                    )
                    print(lines[-1], flush=True)
                time.sleep(2)  # the log appends what was settled last
                (folder / "fresh").mkdir()
                with ExitStack() as fresh_stores:
                    fresh_extra, _ = fresh_store(fresh_stores, args.postgres)
                    with metered_gateway(args.gateway, folder / "fresh", fresh_extra) as (
                        fresh,
                        fresh_key,
                        _,
                    ):
                        ratios = control(server, key, fresh, fresh_key, bodies, args.control_rounds)
        except (StartError, RuntimeError) as error:
            log(f"aborted: {error}")
            return 1
        report, per_request = store.final()
    lines += ["", report, *verdicts(rows, per_request, ratios)]
    text = "\n".join(lines) + "\n"
    print("\n".join(lines[-5:]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    log(f"written to {args.out}")
    return 0


def verdicts(
    rows: list[tuple[int, list[float], float]], per_request: float | None, ratios: list[float]
) -> list[str]:
    if len(rows) < 2:
        return ["(too short to judge the targets: 2 minutes at least)"]
    warm = rows[0][2]
    drift = max(abs(rss - warm) for _, _, rss in rows[1:])
    first, last = sum(rows[0][1]), sum(rows[-1][1])
    control = statistics.median(ratios)

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    return [
        f"- RSS within ±{RSS_BAND_MIB} MiB of minute 1 ({warm:.1f} MiB): largest gap "
        f"{drift:.1f} MiB: {verdict(drift <= RSS_BAND_MIB)}",
        f"- last minute >= {RPS_KEEP}x the first (both scenarios): {last:,.0f} / {first:,.0f}"
        f" = {last / first:.2f}: {verdict(last >= RPS_KEEP * first)}",
        *(
            []
            if per_request is None
            else [
                f"- storage <= {GOAL_BYTES} bytes a request: {per_request:.0f}:"
                f" {verdict(per_request <= GOAL_BYTES)}"
            ]
        ),
        f"- control, the soaked gateway's req/s >= {RPS_KEEP}x a fresh one's ({CONTROL_S} s"
        f" rounds in turn): {', '.join(f'{r:.2f}' for r in ratios)}, median {control:.2f}:"
        f" {verdict(control >= RPS_KEEP)}",
    ]


if __name__ == "__main__":
    sys.exit(main())
