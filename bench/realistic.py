"""Realistic LLM traffic: many concurrent long streams, and plain chat behind a slow
upstream, through the bare pass-through, the gateway (metering on and off) and, with
--peers, LiteLLM and Portkey's gateway; each target pinned to one core, the load
generator and the mock upstream to the other. Rounds alternate the targets; every ratio
is to bare in the same round, and the table shows the median of the rounds.

    python bench/realistic.py --quick        # streams at 100, chat at 250 in flight, 2 rounds
    python bench/realistic.py                # + 200 and 1,000 streams, chat at 500, 3 rounds
    python bench/realistic.py --peers        # + LiteLLM and Portkey (installed under bench/.peers)

The mock sends a stream's 50 events 20 ms apart and answers a plain chat after 300 ms.
bench/README.md ("Realistic traffic") explains every column.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import uvloop
from ablate import ablated_gateway
from concurrent_load import Done, http_request, running
from gateway_target import UPSTREAM_ENV, start_gateway
from load import BENCH_DIR
from procs import Server, StartError, cpu_seconds, free_port, memory_kib, pin
from procs import http_request as one_request
from report import BARE, MIB
from run import CHAT, CHAT_STREAM, Kind

CHUNKS = 50
INTERVAL_MS = 20
DELAY_MS = 300
LOAD_CPU, TARGET_CPU = {0}, {1}
GENERATOR_BUSY_PCT = 90  # the generator and the mock above this: they, not the target, may limit


@dataclass(frozen=True)
class Workload:
    name: str
    kind: Kind
    concurrency: int
    unit: str  # "streams" or "req"

    @property
    def label(self) -> str:
        return f"{self.name}, {self.concurrency:,} in flight"


STREAMS = "streams (50 events, 20 ms apart)"
SLOW_CHAT = "chat, upstream 300 ms"
QUICK_WORKLOADS = [
    Workload(STREAMS, CHAT_STREAM, 100, "streams"),
    Workload(SLOW_CHAT, CHAT, 250, "req"),
]
FULL_WORKLOADS = [
    *QUICK_WORKLOADS[:1],
    Workload(STREAMS, CHAT_STREAM, 200, "streams"),
    Workload(STREAMS, CHAT_STREAM, 1000, "streams"),
    *QUICK_WORKLOADS[1:],
    Workload(SLOW_CHAT, CHAT, 500, "req"),
]


@dataclass
class Target:
    name: str
    server: Server
    headers: dict[str, str]
    idle_mib: float = 0.0
    version: str = ""


@dataclass
class Sample:
    """One target's window in one round."""

    rate: float = 0.0  # completed per second
    cpu_ms: float = 0.0  # the target's CPU per completed request
    first_p50_ms: float = 0.0
    p50_ms: float = 0.0
    target_pct: float = 0.0  # of its core
    generator_pct: float = 0.0  # this process (generator) of its core
    mock_pct: float = 0.0  # the mock upstream, on the generator's core
    peak_mib: float = 0.0
    errors: int = 0
    problem: str = ""


@dataclass
class Cell:
    """One (workload, target): its samples, and their ratios to bare round by round."""

    samples: list[Sample] = field(default_factory=list)
    rate_x: list[float] = field(default_factory=list)
    cpu_x: list[float] = field(default_factory=list)
    first_plus: list[float] = field(default_factory=list)
    p50_plus: list[float] = field(default_factory=list)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(target: Target, workload: Workload, args: argparse.Namespace) -> Sample:
    sample = Sample()
    headers = {"content-type": "application/json", **target.headers}
    status, data = await asyncio.to_thread(
        one_request, target.server.port, "POST", workload.kind.path, workload.kind.data, headers
    )
    if status != 200 or workload.kind.marker not in data:
        sample.problem = f"HTTP {status}: {data[:160].decode(errors='replace')}"
        return sample
    request = http_request(
        "127.0.0.1", target.server.port, workload.kind.path, headers, workload.kind.data
    )
    pid = target.server.pid
    ramp_s = min(1.0, workload.concurrency / 500)
    async with running(
        "127.0.0.1", target.server.port, request, workload.concurrency, ramp_s
    ) as load:
        await asyncio.sleep(args.warmup)
        cpu0, own0, start = cpu_seconds(pid), own_cpu(), time.perf_counter()
        mock0 = cpu_seconds(args.mock_pid)
        rss = [memory_kib(pid)]
        while time.perf_counter() - start < args.seconds:
            await asyncio.sleep(0.25)
            rss.append(memory_kib(pid))
        cpu1, own1, end = cpu_seconds(pid), own_cpu(), time.perf_counter()
        mock1 = cpu_seconds(args.mock_pid)
    done = load.window(start, end)
    ok = [d for d in done if d.status == 200]
    if not ok:
        sample.problem = f"no request completed ({len(done)} failed)"
        return sample
    wall = end - start
    sample.rate = len(ok) / wall
    sample.cpu_ms = (cpu1 - cpu0) * 1000 / len(ok)
    sample.first_p50_ms = _p50(ok, lambda d: d.first_s)
    sample.p50_ms = _p50(ok, lambda d: d.total_s)
    sample.target_pct = (cpu1 - cpu0) * 100 / wall
    sample.generator_pct = (own1 - own0) * 100 / wall
    sample.mock_pct = (mock1 - mock0) * 100 / wall
    sample.peak_mib = max(rss) / MIB
    sample.errors = len(done) - len(ok)
    return sample


def _p50(done: list[Done], value) -> float:
    return statistics.median(value(d) for d in done) * 1000


async def rounds(
    targets: list[Target], workloads: list[Workload], args: argparse.Namespace
) -> dict[tuple[str, str], Cell]:
    cells: dict[tuple[str, str], Cell] = {}
    for number in range(args.rounds):
        for workload in workloads:
            # Alternate the order each round: the first of a round has had an edge.
            order = targets if number % 2 == 0 else targets[::-1]
            by_name = {}
            for target in order:
                sample = await measure(target, workload, args)
                by_name[target.name] = sample
                log(
                    f"round {number + 1} {workload.label:<46} {target.name:<21} "
                    + (
                        f"{sample.rate:7.1f} {workload.unit}/s  CPU {sample.cpu_ms:.3f} ms  "
                        f"first {sample.first_p50_ms:.1f} ms  p50 {sample.p50_ms:.1f} ms  "
                        f"core {sample.target_pct:.0f}%  generator {sample.generator_pct:.0f}%  "
                        f"mock {sample.mock_pct:.0f}%"
                        + (f"  errors {sample.errors}" if sample.errors else "")
                        if not sample.problem
                        else f"failed: {sample.problem}"
                    )
                )
            bare = by_name.get(BARE)
            for name, sample in by_name.items():
                cell = cells.setdefault((workload.label, name), Cell())
                cell.samples.append(sample)
                if bare and not bare.problem and not sample.problem:
                    cell.rate_x.append(sample.rate / bare.rate)
                    cell.cpu_x.append(sample.cpu_ms / bare.cpu_ms)
                    cell.first_plus.append(sample.first_p50_ms - bare.first_p50_ms)
                    cell.p50_plus.append(sample.p50_ms - bare.p50_ms)
    return cells


# -- targets ------------------------------------------------------------------------------


def start_script(folder: Path, name: str, script: str, *args: str) -> Server:
    port = free_port()
    argv = [sys.executable, str(BENCH_DIR / script), "--port", str(port), *args]
    server = Server(argv, port, folder / f"{name}.log", env=UPSTREAM_ENV)
    server.wait_healthy()
    return server


def start_targets(args: argparse.Namespace, folder: Path, upstream: str) -> list[Target]:
    """Every target, started and pinned; those started are stopped if one fails."""
    servers: list[Target] = []
    try:
        _start_each(args, folder, upstream, servers)
    except BaseException:
        for target in reversed(servers):
            target.server.stop()
        raise
    return servers


def _start_each(
    args: argparse.Namespace, folder: Path, upstream: str, servers: list[Target]
) -> None:
    bare = start_script(folder, BARE, "baseline.py", "--upstream", upstream)
    servers.append(Target(BARE, bare, {}))
    gateways = [("gateway", args.gateway, True), ("gateway metering off", args.gateway, False)]
    (folder / "bin").mkdir()
    for name in args.ablate:
        ablated = ablated_gateway(args.gateway, name, folder / "bin")
        gateways.append((f"gateway {name}", ablated, True))
    if args.gateway_b:
        gateways.append((args.name_b, args.gateway_b, True))
    for name, gateway, metering in gateways:
        server, key = start_gateway(gateway, folder / name.replace(" ", "-"), upstream, metering)
        servers.append(Target(name, server, {"authorization": "Bearer " + key}))
    if args.peers:
        import peers  # only with --peers: it installs them

        for name, start in (("Portkey", peers.start_portkey), ("LiteLLM", peers.start_litellm)):
            try:
                server, headers, version = start(folder, upstream)
            except StartError as error:
                log(f"{name} skipped: {error}")
                continue
            servers.append(Target(name, server, headers, version=version))
    for target in servers:
        if len(os.sched_getaffinity(0)) > 1:
            pin(target.server.pid, TARGET_CPU)
        target.idle_mib = memory_kib(target.server.pid) / MIB


# -- the report -----------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _x(value: float | None) -> str:
    return "" if value is None else f" ({value:.2f}x)"


def _plus(value: float | None) -> str:
    return "" if value is None else f" ({value:+.1f})"


def render(
    cells: dict[tuple[str, str], Cell],
    targets: list[Target],
    workloads: list[Workload],
    args: argparse.Namespace,
    versions: str,
) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Realistic traffic, {now}; {machine()}; {versions}",
        f"{args.rounds} alternating rounds of {args.seconds} s after {args.warmup} s of "
        "warm-up; each cell the median of its rounds, in parentheses the median of the "
        "rounds' ratios (x) or differences (ms) to bare in the same round.",
        "",
        "| workload | target | completed/s | CPU ms each | first event p50 ms "
        "| p50 ms | target core % | generator, mock core % | peak RSS MiB | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workload in workloads:
        for target in targets:
            cell = cells.get((workload.label, target.name))
            good = [s for s in cell.samples if not s.problem] if cell else []
            if not cell or not good:
                problem = cell.samples[0].problem if cell else "not run"
                lines.append(f"| {workload.label} | {target.name} | failed: {problem} |")
                continue

            def med(attribute: str, good: list[Sample] = good) -> float:
                return statistics.median(getattr(s, attribute) for s in good)

            first = (
                f"{med('first_p50_ms'):.1f}{_plus(_median(cell.first_plus))}"
                if workload.unit == "streams"
                else ""
            )
            lines.append(
                f"| {workload.label} | {target.name} "
                f"| {med('rate'):,.1f}{_x(_median(cell.rate_x))} "
                f"| {med('cpu_ms'):.3f}{_x(_median(cell.cpu_x))} | {first} "
                f"| {med('p50_ms'):.1f}{_plus(_median(cell.p50_plus))} "
                f"| {med('target_pct'):.0f} | {med('generator_pct'):.0f}, {med('mock_pct'):.0f} "
                f"| {max(s.peak_mib for s in good):.1f} | {sum(s.errors for s in good)} |"
            )
    lines += ["", "| target | idle RSS MiB | version |", "|---|---:|---|"]
    lines += [f"| {t.name} | {t.idle_mib:.1f} | {t.version} |" for t in targets]
    lines += ["", *pairs(cells, targets, workloads), "", *goals(cells, targets)]
    busy = [
        f"{label} on {name}"
        for (label, name), cell in cells.items()
        if any(s.generator_pct + s.mock_pct > GENERATOR_BUSY_PCT for s in cell.samples)
    ]
    if busy:
        lines += [
            "",
            f"The generator and the mock used more than {GENERATOR_BUSY_PCT}% of their core in: "
            + "; ".join(busy)
            + ". There it may have been the limit, not the target.",
        ]
    return "\n".join(lines) + "\n"


def pairs(
    cells: dict[tuple[str, str], Cell], targets: list[Target], workloads: list[Workload]
) -> list[str]:
    """The metered gateway against each other gateway row, round by round (its neighbour
    in time): the median and range of the ratios of completed/s and of CPU each."""
    others = [t.name for t in targets if t.name not in (BARE, "gateway") and not t.version]
    lines = [
        "| workload | gateway ÷ | completed/s, round by round | CPU each, round by round |",
        "|---|---|---:|---:|",
    ]
    for workload in workloads:
        on = cells.get((workload.label, "gateway"))
        for name in others if on else ():
            other = cells.get((workload.label, name))
            if other is None:
                continue
            rounds = [
                (a.rate / b.rate, a.cpu_ms / b.cpu_ms)
                for a, b in zip(on.samples, other.samples, strict=False)
                if not (a.problem or b.problem)
            ]
            if rounds:
                lines.append(
                    f"| {workload.label} | {name} | {_spread([r for r, _ in rounds])} "
                    f"| {_spread([c for _, c in rounds])} |"
                )
    return lines


def _spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def goals(cells: dict[tuple[str, str], Cell], targets: list[Target]) -> list[str]:
    """Issue 40's goals for the metered gateway, met or not, from this run's medians."""

    def ratio(label: str, name: str, attribute: str) -> float | None:
        cell = cells.get((label, name))
        return _median(getattr(cell, attribute)) if cell else None

    def over_off(label: str) -> float | None:
        on, off = cells.get((label, "gateway")), cells.get((label, "gateway metering off"))
        if not on or not off:
            return None
        pairs = [
            a.cpu_ms / b.cpu_ms
            for a, b in zip(on.samples, off.samples, strict=False)
            if not (a.problem or b.problem)
        ]
        return _median(pairs)

    streams, chat = QUICK_WORKLOADS[0].label, QUICK_WORKLOADS[1].label
    checks = [
        (f"{streams}: CPU per stream ÷ bare", ratio(streams, "gateway", "cpu_x"), "<=", 1.4),
        (f"{streams}: CPU per stream ÷ metering off", over_off(streams), "<=", 1.15),
        (f"{streams}: first event p50 - bare, ms",
         ratio(streams, "gateway", "first_plus"), "<=", 5),
        (f"{chat}: req/s ÷ bare", ratio(chat, "gateway", "rate_x"), ">=", 0.95),
        (f"{chat}: p50 - bare, ms", ratio(chat, "gateway", "p50_plus"), "<=", 5),
        (f"{chat}: CPU per request ÷ bare", ratio(chat, "gateway", "cpu_x"), "<=", 1.4),
        (f"{chat}: CPU per request ÷ metering off", over_off(chat), "<=", 1.15),
    ]  # fmt: skip
    gateway = next((t for t in targets if t.name == "gateway"), None)
    if gateway:
        checks.append(("gateway idle RSS, MiB", gateway.idle_mib, "<=", 60))
    lines = ["| goal (metered gateway) | measured | goal | met |", "|---|---:|---:|---|"]
    for what, value, sense, bound in checks:
        if value is None:
            lines.append(f"| {what} | not measured | {sense} {bound} | |")
            continue
        met = value <= bound if sense == "<=" else value >= bound
        lines.append(f"| {what} | {value:.2f} | {sense} {bound} | {'yes' if met else 'no'} |")
    return lines


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{model}, nproc {os.cpu_count()}, Python {platform.python_version()}"


def gateway_version() -> str:
    from importlib.metadata import version

    return f"model-gateway {version('model-gateway')}"


# -- main -----------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 streams and 250 chats only")
    parser.add_argument("--peers", action="store_true", help="add LiteLLM and Portkey")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--warmup", type=float)
    parser.add_argument(
        "--only", help="comma-separated workload labels' starts, e.g. 'streams' or 'chat'"
    )
    parser.add_argument(
        "--concurrency", help="comma-separated in-flight counts to keep, e.g. 100,250"
    )
    parser.add_argument("--gateway", type=Path, default=Path(sys.executable).with_name("gateway"))
    parser.add_argument(
        "--ablate",
        action="append",
        default=[],
        help="add the metered gateway with this part taken out (bench/ablate.py's names)",
    )
    parser.add_argument("--gateway-b", type=Path, help="add another checkout's `gateway`")
    parser.add_argument("--name-b", default="gateway before", help="--gateway-b's row name")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "realistic.md")
    args = parser.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.seconds = args.seconds or (4.0 if args.quick else 8.0)
    args.warmup = args.warmup if args.warmup is not None else 2.0
    return args


def chosen(args: argparse.Namespace) -> list[Workload]:
    workloads = QUICK_WORKLOADS if args.quick else FULL_WORKLOADS
    if args.only:
        starts = tuple(args.only.split(","))
        workloads = [w for w in workloads if w.name.startswith(starts)]
    if args.concurrency:
        keep = {int(n) for n in args.concurrency.split(",")}
        workloads = [w for w in workloads if w.concurrency in keep]
    return workloads


async def bench(args: argparse.Namespace, folder: Path) -> str:
    workloads = chosen(args)
    mock = start_script(
        folder, "mock", "mock_upstream.py", "--chunks", str(CHUNKS),
        "--interval-ms", str(INTERVAL_MS), "--delay-ms", str(DELAY_MS),
    )  # fmt: skip
    targets: list[Target] = []
    args.mock_pid = mock.pid
    try:
        targets = start_targets(args, folder, mock.url + "/v1")
        if len(os.sched_getaffinity(0)) > 1:
            pin(mock.pid, LOAD_CPU)
        cells = await rounds(targets, workloads, args)
    finally:
        for target in reversed(targets):
            target.server.stop()
        mock.stop()
    versions = ", ".join(
        [gateway_version(), *(f"{t.name} {t.version}" for t in targets if t.version)]
    )
    return render(cells, targets, workloads, args, versions)


def main() -> int:
    args = parse_args()
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, LOAD_CPU)  # the generator; targets are pinned to the other
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a thousand connections
    with tempfile.TemporaryDirectory(prefix="gateway-realistic-") as tmp:
        try:
            text = uvloop.run(bench(args, Path(tmp)))
        except StartError as error:
            log(f"bench aborted: {error}")
            return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    log(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
