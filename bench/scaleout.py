"""Scale-out: two gateway instances on one PostgreSQL database behind HAProxy (docs/deployment.md's
recipe, scripts/deploy/haproxy.cfg) versus one gateway on SQLite, and between them one
instance on PostgreSQL (what the backend costs, apart from the second instance). Chat,
32 connections, metering on, the same mock upstream; wrk rounds rotate over the three.
Prints req/s and CPU ms per request of each, and their ratios to SQLite.

CPU per request counts every process that serves a side: the gateway(s), HAProxy, and
the PostgreSQL backends connected to that side's own database (not PostgreSQL's shared
writers: WAL writer, checkpointer). The mock upstream and wrk serve every side alike and
are not counted. "other CPU %" is what the rest of the machine used meanwhile (other
PostgreSQL work included): high values make a row suspect.

On a 2-core machine everything (wrk, the mock, two instances, HAProxy, PostgreSQL) shares
the same two cores: the ratios measure contention as much as scale.

    python bench/scaleout.py [--rounds 3] [--seconds 4]

Needs wrk, haproxy and a PostgreSQL server (--postgres, default
postgresql://postgres@127.0.0.1:5432/postgres); says which is missing and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from gateway_target import UPSTREAM_ENV, cli_field, start_gateway, start_mock, write_config
from load import BENCH_DIR, run_wrk, wrk_version
from procs import (
    Server,
    cpu_seconds,
    free_port,
    machine_busy_seconds,
    own_seconds,
    read_proc,
)
from report import machine
from run import CHAT

RECIPE = BENCH_DIR.parent / "scripts" / "deploy" / "haproxy.cfg"
WARMUP_S = 1


@dataclass(frozen=True)
class Round:
    rps: float
    cpu_ms: dict[str, float]  # CPU ms per request, per part of the deployment
    other_pct: float  # CPU the rest of the machine used meanwhile, % of one core


@dataclass
class Side:
    """One deployment under load: where wrk sends, with which key, and its CPU reading."""

    name: str
    url: str
    key: str
    cpu: Callable[[], dict[str, float]]  # CPU seconds so far, per part
    rounds: list[Round] = field(default_factory=list)
    database_url: str | None = None  # a PostgreSQL side's database

    def medians(self) -> tuple[float, float, dict[str, float], float]:
        """req/s, CPU ms per request, the same per part, other CPU %."""
        rounds = self.rounds
        parts = {p: statistics.median(r.cpu_ms[p] for r in rounds) for p in rounds[0].cpu_ms}
        return (
            statistics.median(r.rps for r in rounds),
            statistics.median(sum(r.cpu_ms.values()) for r in rounds),
            parts,
            statistics.median(r.other_pct for r in rounds),
        )


async def _execute(admin_url: str, sql: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextmanager
def database(admin_url: str, settings: dict[str, str] | None = None) -> Iterator[str]:
    """A new database, dropped on the way out; `settings` apply to its sessions."""
    name = f"gateway_bench_{secrets.token_hex(4)}"
    asyncio.run(_execute(admin_url, f'CREATE DATABASE "{name}"'))
    for setting, value in (settings or {}).items():
        asyncio.run(_execute(admin_url, f'ALTER DATABASE "{name}" SET {setting} = {value}'))
    try:
        yield urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))
    finally:
        asyncio.run(_execute(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def backends_cpu(database_url: str) -> float:
    """CPU seconds of the PostgreSQL backends now connected to this database (the gateways'
    pools: long-lived, so a round's difference is what it cost). A backend's process title
    names its database ("postgres: 15/main: USER DATABASE HOST(PORT) STATE"): /proc alone
    finds them, without a connection the server may be out of."""
    name = f" {urlsplit(database_url).path.lstrip('/')} "
    total = 0.0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        title = read_proc(cmdline).replace("\0", " ")
        if title.startswith("postgres:") and name in title:
            total += cpu_seconds(int(cmdline.parent.name))
    return total


def instance(gateway: Path, folder: Path, upstream: str, database_url: str, shared: Path):
    """A gateway on the shared database and secrets (bench/gateway_target.py's config)."""
    port = free_port()
    config = write_config(folder, port, upstream, True)
    text = config.read_text()
    for old, new in (
        ('url = "sqlite:///gw.db"', f'url = "{database_url}"'),
        ('"key-pepper"', f'"{shared}/key-pepper"'),
        ('"signing-key"', f'"{shared}/signing-key"'),
    ):
        assert text.count(old) == 1, f"bench/gateway_target.py's config has no single {old}"
        text = text.replace(old, new)
    config.write_text(text)
    server = Server(
        [str(gateway), "serve", "--config", str(config)],
        port,
        folder / "gateway.log",
        env=UPSTREAM_ENV,
        cwd=folder,
    )
    server.wait_healthy(15)
    return server, config


def postgresql(
    stack: ExitStack,
    args,
    folder: Path,
    upstream: str,
    count: int,
    gateway: Path | None = None,
    label: str = "",
) -> Side:
    """`count` instances on a database of their own; two stand behind HAProxy. `gateway`:
    another checkout's command instead of args.gateway; `label` ends the side's name."""
    gateway = gateway or args.gateway
    folder.mkdir()
    database_url = stack.enter_context(database(args.postgres, getattr(args, "settings", None)))
    shared = folder / "secrets"
    shared.mkdir()
    gateways = []
    for n in range(1, count + 1):  # one after the other: the first runs the migrations
        server, config = instance(gateway, folder / f"gw{n}", upstream, database_url, shared)
        stack.callback(server.stop)
        gateways.append(server)
    project = cli_field(
        gateway, config, "id", "projects", "create", "bench", "--balance", "1000000"
    )
    key = cli_field(
        gateway, config, "key", "keys", "create", "--project", project, "--scopes", "inference"
    )

    def cpu() -> dict[str, float]:
        return {
            "gateways": sum(cpu_seconds(s.pid) for s in gateways),
            "PostgreSQL": backends_cpu(database_url),
        }

    if count == 1:
        return Side(
            "1 instance, PostgreSQL" + label, gateways[0].url, key, cpu, database_url=database_url
        )
    proxy = haproxy(stack, args, folder, gateways)
    return Side(
        f"{count} instances, PostgreSQL, HAProxy",
        proxy.url,
        key,
        lambda: {**cpu(), "HAProxy": cpu_seconds(proxy.pid)},
    )


def haproxy(stack: ExitStack, args, folder: Path, gateways: list[Server]) -> Server:
    """scripts/deploy/haproxy.cfg as shipped, the addresses in its environment."""
    port = free_port()
    addresses = {f"GATEWAY_{n}": f"127.0.0.1:{s.port}" for n, s in enumerate(gateways, start=1)}
    proxy = Server(
        [args.haproxy, "-db", "-f", str(RECIPE)],
        port,
        folder / "haproxy.log",
        env={"GATEWAY_LISTEN": f"127.0.0.1:{port}", **addresses},
    )
    stack.callback(proxy.stop)
    proxy.wait_healthy(15)
    return proxy


def sqlite(stack: ExitStack, args, folder: Path, upstream: str) -> Side:
    server, key = start_gateway(args.gateway, folder / "sqlite", upstream, True)
    stack.callback(server.stop)
    return Side("1 instance, SQLite", server.url, key, lambda: {"gateway": cpu_seconds(server.pid)})


def load(args, side: Side, body: Path, raw, seconds: int, mock_pid: int) -> None:
    """One wrk run against `side`; with seconds > WARMUP_S, a measured round."""
    before, busy, ours, mock = (
        side.cpu(),
        machine_busy_seconds(),
        own_seconds(),
        cpu_seconds(mock_pid),
    )
    started = time.monotonic()
    result = run_wrk(
        side.url + CHAT.path, args.connections, seconds, "post.lua", [side.key, str(body)], raw
    )
    wall = time.monotonic() - started
    after = side.cpu()
    if result.errors or result.bad_status:
        raise SystemExit(f"{side.name}: {result.errors} errors, {result.bad_status} bad answers")
    if seconds <= WARMUP_S:
        return
    spent = {part: after[part] - before[part] for part in after}
    counted = sum(spent.values()) + (own_seconds() - ours) + (cpu_seconds(mock_pid) - mock)
    other = 100 * max(0.0, machine_busy_seconds() - busy - counted) / wall
    per_request = {part: 1000 * s / max(result.requests, 1) for part, s in spent.items()}
    side.rounds.append(Round(result.rps, per_request, other))


def report(args, sides: list[Side]) -> str:
    base_rps, base_cpu, _, _ = sides[0].medians()
    lines = [
        "",
        "### Scale-out: instances on PostgreSQL versus one on SQLite",
        "",
        f"chat, {args.connections} connections, metering on, {args.rounds} rotating rounds"
        f" of {args.seconds} s; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())};"
        f" {machine()}; {wrk_version()}",
        "",
        "| deployment | req/s (median) | CPU ms/request | of which | other CPU % |",
        "|---|---:|---:|---|---:|",
    ]
    for side in sides:
        rps, cpu, parts, other = side.medians()
        ratio = side is not sides[0]
        lines.append(
            f"| {side.name} | {rps:,.0f}{f' ({rps / base_rps:.2f}x)' if ratio else ''}"
            f" | {cpu:.3f}{f' ({cpu / base_cpu:.2f}x)' if ratio else ''}"
            f" | {', '.join(f'{p} {ms:.3f}' for p, ms in parts.items())} | {other:.0f} |"
        )
    cores = len(os.sched_getaffinity(0))
    lines += [
        "",
        f"On {cores} cores wrk, the mock upstream, the instances, HAProxy and PostgreSQL share"
        " the same cores: the ratios measure contention as much as scale. CPU counts the"
        " processes serving each side (PostgreSQL: the backends of its own database),"
        " not wrk nor the mock.",
    ]
    return "\n".join(lines)


def missing(args) -> str | None:
    if wrk_version() is None:
        return "wrk is not installed (apt-get install wrk)"
    if args.haproxy is None:
        return "haproxy is not installed (bash scripts/system-deps.sh)"
    try:
        asyncio.run(_execute(args.postgres, "SELECT 1"))
    except (OSError, asyncpg.PostgresError) as error:
        return f"no PostgreSQL at {args.postgres}: {error}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--gateway", type=Path, default=Path(sys.executable).with_name("gateway"))
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "GATEWAY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    args.haproxy = shutil.which("haproxy", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    absent = missing(args)
    if absent is not None:
        print(f"\nScale-out row skipped: {absent}.")
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
            postgresql(stack, args, folder / "pg-1", upstream, 1),
            postgresql(stack, args, folder / "pg-2", upstream, 2),
        ]
        with (folder / "wrk.raw").open("w") as raw:
            for side in sides:
                load(args, side, body, raw, WARMUP_S, mock.pid)
            for _ in range(args.rounds):
                for side in sides:
                    load(args, side, body, raw, args.seconds, mock.pid)
    print(report(args, sides))


if __name__ == "__main__":
    main()
