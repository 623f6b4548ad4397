"""Where a gateway's CPU goes, per request: py-spy samples the gateway while wrk loads one
scenario, and the report lists the functions with the most samples (self and inclusive),
converted to microseconds per request (samples / rate / requests).

    pip install py-spy   # into the bench's venv
    python bench/profile.py --scenario chat-stream [--gateway ../other/.venv/bin/gateway]

Metering is on (as `make bench`'s gateway row); `--extra` appends config lines. The
collapsed stacks go to `--out` (default bench/results/profile-<scenario>.txt) for a
flame graph (e.g. `flamegraph.pl`, or speedscope, which reads them).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
from pathlib import Path

from gateway_target import metered_gateway
from load import BENCH_DIR, run_wrk
from paired import SCENARIOS

RATE = 200  # samples per second
PY_SPY = str(Path(sys.executable).with_name("py-spy"))  # pip install py-spy: beside python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", choices=SCENARIOS, default="chat-stream")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--gateway", type=Path, default=Path(sys.executable).with_name("gateway"))
    parser.add_argument("--extra", default="")
    parser.add_argument("--delay-ms", default="0", help="the mock waits this long to answer")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or BENCH_DIR / "results" / f"profile-{args.scenario}.txt"
    kind = SCENARIOS[args.scenario]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        body = folder / "body.json"
        body.write_bytes(kind.data)
        with (
            metered_gateway(args.gateway, folder, args.extra, ("--delay-ms", args.delay_ms)) as (
                server,
                key,
                _,
            ),
            (folder / "wrk.raw").open("w") as raw,
        ):
            url = server.url + kind.path
            run_wrk(url, args.connections, 2, "post.lua", [key, str(body)], raw)  # warm-up
            spy = subprocess.Popen(
                [PY_SPY, "record", "--pid", str(server.pid), "--rate", str(RATE), "--format",
                 "raw", "--nonblocking", "--duration", str(args.seconds - 1), "-o", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            result = run_wrk(url, args.connections, args.seconds, "post.lua", [key, str(body)], raw)
            spy.wait(60)
    report(out, result.requests, result.rps, args.top)


def report(stacks: Path, requests: int, rps: float, top: int) -> None:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in stacks.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if not frames:
            continue
        n = int(count)
        total += n
        names = [_short(frame) for frame in frames.split(";")]
        own[names[-1]] += n
        for name in set(names):
            inclusive[name] += n
    per_request = 1e6 / RATE / max(requests, 1)  # µs of CPU per sample, per request
    print(
        f"{requests} requests ({rps:,.0f}/s), {total} samples, "
        f"{total * per_request:.0f} µs sampled per request (idle excluded: --nonblocking "
        "samples only running code)"
    )
    for title, counter in (("self", own), ("inclusive", inclusive)):
        print(f"\n| {title} µs/req | function |\n|---:|---|")
        for name, n in counter.most_common(top):
            print(f"| {n * per_request:.1f} | {name} |")


def _short(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `func (file.py)`: lines vary, files and names do not."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rpartition(":")[0]
    return f"{name} ({'/'.join(Path(path).parts[-2:])})"


if __name__ == "__main__":
    main()
