"""Where a gateway's CPU goes below Python, for two configurations: `perf record` (the
software clock: these VMs have no hardware counters) samples the gateway's process, every
thread, while wrk loads one scenario, and the report gives microseconds a request by
shared object (the interpreter, SQLite, the kernel, libc...) and the symbols that differ
most between A and B. bench/profile.py (py-spy) sees Python's frames; this sees the rest:
system calls, wake-ups, SQLite's C. This is how the one-connection CPU was explained
(docs/speed.md).

    apt-get install -y linux-perf
    python bench/perf_split.py --connections 1 --name-b "metering off" \\
        --extra-b $'[metering]\\nenabled = false'

A and B run one after the other, each with its own mock and a fresh database: compare
their shapes, not single-digit microseconds (pair runs with bench/paired.py for those).
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from gateway_target import metered_gateway
from load import run_wrk
from paired import SCENARIOS

RATE_HZ = 2000
LINE = re.compile(r"\s+([\d.]+)%\s+(\S+)\s+\[.\]\s+(.*)")


def sampled(folder: Path, scenario: str, connections: int, seconds: int, extra: str):
    """(µs a request by (shared object, symbol), requests) of one gateway under load."""
    kind = SCENARIOS[scenario]
    body = folder / "body.json"
    body.write_bytes(kind.data)
    data = folder / "perf.data"
    gateway = Path(sys.executable).with_name("gateway")
    with (
        metered_gateway(gateway, folder, extra) as (server, key, _),
        (folder / "wrk.raw").open("w") as raw,
    ):
        run_wrk(server.url + kind.path, connections, 2, "post.lua", [key, str(body)], raw)
        perf = subprocess.Popen(
            ["perf", "record", "-e", "cpu-clock", "-F", str(RATE_HZ), "-p", str(server.pid),
             "-o", str(data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        result = run_wrk(
            server.url + kind.path, connections, seconds, "post.lua", [key, str(body)], raw
        )
        perf.send_signal(signal.SIGINT)
        perf.wait(60)
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso,sym"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    counted = re.search(r"Event count \(approx.\): (\d+)", report)
    if counted is None:
        raise SystemExit(f"perf recorded nothing: {report[-300:]}")
    per_request = int(counted.group(1)) / 1e3 / max(result.requests, 1)  # ns -> µs
    shares = {}
    for line in report.splitlines():
        match = LINE.match(line)
        if match:
            share, dso, symbol = match.groups()
            shares[(dso, symbol.strip())] = float(share) / 100 * per_request
    return shares, result.requests


def by_object(shares: dict[tuple[str, str], float]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for (dso, _), us in shares.items():
        totals[dso] = totals.get(dso, 0.0) + us
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="chat")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--name-a", default="as configured")
    parser.add_argument("--extra-a", default="")
    parser.add_argument("--name-b", required=True)
    parser.add_argument("--extra-b", default="")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    runs = []
    for extra in (args.extra_a, args.extra_b):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(sampled(Path(tmp), args.scenario, args.connections, args.seconds, extra))
    (a, a_requests), (b, b_requests) = runs
    print(
        f"{args.scenario}, {args.connections} connections: µs of the gateway's CPU a request"
        f" ({args.name_a}: {a_requests} requests, {args.name_b}: {b_requests})\n"
    )
    print(f"| shared object | {args.name_a} | {args.name_b} |\n|---|---:|---:|")
    objects_a, objects_b = by_object(a), by_object(b)
    ranked = sorted(objects_a.keys() | objects_b.keys(), key=lambda d: -objects_a.get(d, 0))
    for dso in ranked[:10]:
        print(f"| {dso} | {objects_a.get(dso, 0):.1f} | {objects_b.get(dso, 0):.1f} |")
    print(f"| all | {sum(objects_a.values()):.1f} | {sum(objects_b.values()):.1f} |\n")
    print(f"| symbol (shared object) | {args.name_a} | {args.name_b} | A - B |")
    print("|---|---:|---:|---:|")
    differ = sorted(a.keys() | b.keys(), key=lambda k: -abs(a.get(k, 0) - b.get(k, 0)))
    for key in differ[: args.top]:
        dso, symbol = key
        first, second = a.get(key, 0.0), b.get(key, 0.0)
        print(f"| {symbol[:60]} ({dso}) | {first:.1f} | {second:.1f} | {first - second:+.1f} |")


if __name__ == "__main__":
    main()
