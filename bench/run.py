"""Bench runner: the mock upstream direct, the bare pass-through and the gateway.

Starts every process itself, loads each target in turn with the same wrk load,
stops everything and prints one Markdown report (also written to --out).

    python bench/run.py --quick      # what `make bench` runs: under 3 minutes
    python bench/run.py              # longer runs, steadier numbers
    python bench/run.py --soak       # 10 minutes of mixed load, RSS every minute

bench/README.md explains every column.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gateway_target import MODEL, UPSTREAM_ENV, start_gateway
from load import BENCH_DIR, WRK_THREADS, run_wrk, wrk_version
from procs import (
    Server,
    StartError,
    cpu_seconds,
    free_port,
    http_request,
    machine_busy_seconds,
    memory_kib,
    own_seconds,
)
from report import BARE, MIB, Memory, Report, Row, SoakMinute, render

SETTLE_S = 0.3  # after a run, so that work the server defers is counted too
SOAK_CONNECTIONS = 32
BUSY_OTHER_PCT = 10  # more CPU than this used outside the bench makes a row suspect
PROMPT = "Say hello in a few words."


@dataclass(frozen=True)
class Kind:
    """One kind of request: where it goes, its body, and what a proper answer holds."""

    name: str
    path: str
    body: dict
    marker: bytes

    @property
    def data(self) -> bytes:
        return json.dumps(self.body).encode()


CHAT_BODY = {
    "model": MODEL,
    "max_tokens": 64,
    "messages": [
        {"role": "system", "content": "You are a benchmark."},
        {"role": "user", "content": PROMPT},
    ],
}
RESPONSES_BODY = {"model": MODEL, "max_output_tokens": 64, "input": PROMPT}
CHAT = Kind("chat", "/v1/chat/completions", CHAT_BODY, b'"choices"')
CHAT_STREAM = Kind(
    "chat stream",
    CHAT.path,
    {**CHAT_BODY, "stream": True, "stream_options": {"include_usage": True}},
    b"data: [DONE]",
)
RESPONSES = Kind("responses", "/v1/responses", RESPONSES_BODY, b'"output"')
RESPONSES_STREAM = Kind(
    "responses stream",
    RESPONSES.path,
    {**RESPONSES_BODY, "stream": True},
    b"event: response.completed",
)
SCENARIOS = [
    (CHAT, 32),
    (CHAT, 1),
    (CHAT_STREAM, 32),
    (CHAT_STREAM, 1),
    (RESPONSES, 32),
    (RESPONSES_STREAM, 32),
]
SOAK_MIX = [CHAT, CHAT_STREAM, RESPONSES, RESPONSES_STREAM]


@dataclass
class Target:
    name: str
    server: Server
    auth: str = "-"  # API key, "-" for none
    idle_mib: float = 0.0


class Bench:
    """The processes of one bench run and the report they produce."""

    def __init__(self, args: argparse.Namespace, folder: Path, raw: TextIO):
        self.args = args
        self.folder = folder
        self.raw = raw
        self.servers: list[Server] = []
        self.targets: list[Target] = []
        self.bodies: dict[str, Path] = {}
        for kind in SOAK_MIX:
            self.bodies[kind.name] = folder / f"{kind.name.replace(' ', '-')}.json"
            self.bodies[kind.name].write_bytes(kind.data)

    def start_script(self, name: str, script: str, *args: str) -> Server:
        port = free_port()
        argv = [sys.executable, str(BENCH_DIR / script), "--port", str(port), *args]
        server = Server(argv, port, self.folder / f"{name}.log", env=UPSTREAM_ENV)
        self.servers.append(server)
        try:
            server.wait_healthy()
        except StartError as error:
            raise StartError(f"{name}: {error}") from error
        return server

    def add_target(self, target: Target) -> None:
        target.idle_mib = memory_kib(target.server.pid) / MIB
        self.targets.append(target)

    def start(self, report: Report) -> None:
        mock = self.start_script(
            "mock",
            "mock_upstream.py",
            "--chunks",
            str(self.args.chunks),
            "--delay-ms",
            str(self.args.delay_ms),
        )
        self.add_target(Target("mock direct", mock))
        upstream = mock.url + "/v1"
        self.add_target(
            Target(BARE, self.start_script(BARE, "baseline.py", "--upstream", upstream))
        )
        variants = [("gateway", True)]
        if not self.args.soak:
            variants.append(("gateway metering off", False))
        for name, metering in variants:
            try:
                server, key = start_gateway(
                    self.args.gateway, self.folder / name.replace(" ", "-"), upstream, metering
                )
            except StartError as error:
                report.notes.append(f"{name} skipped: {error}")
                log(f"{name} skipped: {error}")
                continue
            self.servers.append(server)
            self.add_target(Target(name, server, key))

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()

    def check_answer(self, target: Target, kind: Kind) -> str:
        """'' if one request gets a proper answer, else what was wrong with it."""
        headers = {"content-type": "application/json"}
        if target.auth != "-":
            headers["authorization"] = "Bearer " + target.auth
        try:
            status, data = http_request(target.server.port, "POST", kind.path, kind.data, headers)
        except OSError as error:
            return f"request failed: {error}"
        text = data[:200].decode(errors="replace")
        if status != 200:
            return f"HTTP {status}: {text}"
        return "" if kind.marker in data else f"answer lacks {kind.marker.decode()}: {text}"

    def measure(self, target: Target, kind: Kind, connections: int) -> Row:
        row = Row(kind.name, connections, target.name)
        row.problem = self.check_answer(target, kind)
        if row.problem:
            return row
        url = target.server.url + kind.path
        args = [target.auth, str(self.bodies[kind.name])]
        pid = target.server.pid
        try:
            if self.args.warmup:
                run_wrk(url, connections, self.args.warmup, "post.lua", args, self.raw)
            rss = [memory_kib(pid)]
            before = self.cpu_snapshot(pid)
            row.result = run_wrk(
                url,
                connections,
                self.args.seconds,
                "post.lua",
                args,
                self.raw,
                lambda: rss.append(memory_kib(pid)),
            )
        except RuntimeError as error:
            row.problem = str(error)
            return row
        time.sleep(SETTLE_S)
        if target.server.proc.poll() is not None:
            row.result, row.problem = None, "the server exited during the run"
            return row
        after = self.cpu_snapshot(pid)
        server, ours, busy, wall = (b - a for a, b in zip(before, after, strict=True))
        row.cpu_ms = server * 1000 / max(1, row.result.requests)
        row.other_cpu_pct = max(0.0, busy - ours) * 100 / wall
        row.peak_mib = max(rss) / MIB
        return row

    def cpu_snapshot(self, pid: int) -> tuple[float, float, float, float]:
        """CPU seconds of the server, of all bench processes, of the machine; wall time."""
        ours = own_seconds() + sum(cpu_seconds(server.pid) for server in self.servers)
        return cpu_seconds(pid), ours, machine_busy_seconds(), time.monotonic()

    def scenarios(self, report: Report) -> None:
        """Every scenario on every target, --rounds times; each row is its median run."""
        runs: dict[tuple[str, int, str], list[Row]] = {}
        for _ in range(self.args.rounds):
            for kind, connections in SCENARIOS:
                for target in self.targets:
                    row = self.measure(target, kind, connections)
                    runs.setdefault((kind.name, connections, target.name), []).append(row)
                    r = row.result
                    log(
                        f"{kind.name:<16} c{connections:<3} {target.name:<20} "
                        + (
                            f"{r.rps:9,.0f} req/s  p50 {r.p50_ms:.3f} ms  "
                            f"CPU {row.cpu_ms:.3f} ms/req  other CPU {row.other_cpu_pct:.0f} %"
                            if r
                            else f"failed: {row.problem}"
                        )
                    )
        for (scenario, connections, target), rows in runs.items():
            measured = sorted((r for r in rows if r.result), key=lambda r: r.result.rps)
            failed = [r for r in rows if r.result is None]
            if measured and failed:
                report.notes.append(
                    f"{scenario} c{connections} on {target}: {len(failed)} of "
                    f"{len(rows)} runs failed: {failed[0].problem}"
                )
            report.rows.append(measured[len(measured) // 2] if measured else failed[0])
        busy = [r for r in report.rows if r.other_cpu_pct > BUSY_OTHER_PCT]
        if busy:
            report.notes.append(
                f"{len(busy)} of {len(report.rows)} rows ran while processes "
                f"outside the bench used more than {BUSY_OTHER_PCT} % of a "
                "core (other CPU %): rerun on a quiet machine"
            )

    def soak(self, report: Report) -> None:
        target = next((t for t in self.targets if t.name == "gateway"), None)
        if target is None:
            target = next(t for t in self.targets if t.name == BARE)
            report.notes.append("the gateway is not available: soaked the bare pass-through")
        mix = ", ".join(kind.name for kind in SOAK_MIX)
        report.soak_title = (
            f"{target.name}, {self.args.soak_minutes} min at "
            f"{SOAK_CONNECTIONS} connections, rotating {mix}"
        )
        args = [target.auth]
        for kind in SOAK_MIX:
            problem = self.check_answer(target, kind)
            if problem:
                report.notes.append(f"soak: {kind.name} on {target.name} failed: {problem}")
                return
            args += [kind.path, str(self.bodies[kind.name])]
        report.soak.append(SoakMinute(0, memory_kib(target.server.pid) / MIB))
        for minute in range(1, self.args.soak_minutes + 1):
            try:
                result = run_wrk(
                    target.server.url + "/", SOAK_CONNECTIONS, 60, "mix.lua", args, self.raw
                )
            except RuntimeError as error:
                report.notes.append(f"soak stopped in minute {minute}: {error}")
                return
            rss = memory_kib(target.server.pid) / MIB
            report.soak.append(SoakMinute(minute, rss, result))
            log(f"soak minute {minute}: {result.rps:,.0f} req/s, RSS {rss:.1f} MiB")

    def memory(self, report: Report) -> None:
        for t in self.targets:
            pid = t.server.pid
            report.memory.append(
                Memory(t.name, t.idle_mib, memory_kib(pid) / MIB, memory_kib(pid, "VmHWM") / MIB)
            )


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one round of short runs (4 s after 1 s of warm-up): under 3 minutes",
    )
    parser.add_argument(
        "--soak",
        action="store_true",
        help="mixed load on the gateway for --soak-minutes, RSS every minute",
    )
    parser.add_argument("--soak-minutes", type=int, default=10)
    parser.add_argument("--seconds", type=int, help="measured seconds per run")
    parser.add_argument("--warmup", type=int, help="warm-up seconds before each run")
    parser.add_argument(
        "--rounds",
        type=int,
        help="runs per scenario and target; the report keeps the one with the median req/s",
    )
    parser.add_argument("--chunks", type=int, default=8, help="mock: text deltas per answer")
    parser.add_argument("--delay-ms", type=float, default=0, help="mock: delay per answer")
    parser.add_argument(
        "--gateway",
        type=Path,
        default=Path(sys.executable).parent / "gateway",
        help="the gateway command (default: the one beside this Python)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="Markdown report (default: bench/results/latest.md, or soak.md with --soak)",
    )
    args = parser.parse_args()
    args.seconds = args.seconds or (4 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.out = args.out or BENCH_DIR / "results" / ("soak.md" if args.soak else "latest.md")
    return args


def main() -> int:
    args = parse_args()
    version = wrk_version()
    if version is None:
        log("wrk is not installed. Install it from Debian's packages: apt-get install -y wrk")
        return 2
    load = f"{version}, {WRK_THREADS} thread; mock: {args.chunks} chunks, {args.delay_ms:g} ms"
    if not args.soak:
        load += (
            f"; {args.rounds} round(s) of {args.seconds} s runs after {args.warmup} s of "
            "warm-up, each row the run with the median req/s"
        )
    report = Report(load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="gateway-bench-") as folder,
        args.out.with_suffix(".raw").open("w") as raw,
    ):
        bench = Bench(args, Path(folder), raw)
        try:
            bench.start(report)
            if args.soak:
                bench.soak(report)
            else:
                bench.scenarios(report)
            bench.memory(report)
        except StartError as error:
            log(f"bench aborted: {error}")
            return 1
        finally:
            bench.stop()
    text = render(report)
    args.out.write_text(text)
    print(text)
    log(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
