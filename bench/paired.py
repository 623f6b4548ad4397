"""Two gateways side by side (two configurations, or two checkouts): wrk rounds alternate
A, B, A, B... on the same mock upstream, so that what else the machine does hits both
alike. Prints req/s and CPU per request of each, and their ratios (B / A; with --bare,
the bare pass-through alternates too, and every ratio is to it).

    python bench/paired.py --name-b "metrics off" --extra-b $'[metrics]\\nenabled = false'
    python bench/paired.py --name-b before --gateway-b ../other-checkout/.venv/bin/gateway
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from gateway_target import UPSTREAM_ENV, start_gateway, start_mock
from load import BENCH_DIR, run_wrk
from procs import Server, cpu_seconds, free_port
from run import CHAT, CHAT_STREAM, RESPONSES, RESPONSES_STREAM

SCENARIOS = {
    "chat": CHAT,
    "chat-stream": CHAT_STREAM,
    "responses": RESPONSES,
    "responses-stream": RESPONSES_STREAM,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name-a", default="as configured")
    parser.add_argument("--extra-a", default="")
    parser.add_argument("--name-b", required=True)
    parser.add_argument("--extra-b", default="")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--scenario", choices=SCENARIOS, default="chat")
    parser.add_argument("--delay-ms", default="0", help="the mock waits this long to answer")
    parser.add_argument("--gateway", type=Path, default=Path(sys.executable).with_name("gateway"))
    parser.add_argument("--gateway-b", type=Path, help="B's own `gateway` (another checkout)")
    parser.add_argument(
        "--bare", action="store_true", help="alternate bench/baseline.py too (ratios to it)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        body = folder / "chat.json"
        body.write_bytes(SCENARIOS[args.scenario].data)
        mock = start_mock(folder, "--delay-ms", args.delay_ms)
        servers = [mock]
        try:
            targets = []
            if args.bare:
                bare_port = free_port()
                bare = Server(
                    [
                        sys.executable,
                        str(BENCH_DIR / "baseline.py"),
                        "--port",
                        str(bare_port),
                        "--upstream",
                        mock.url + "/v1",
                    ],
                    bare_port,
                    folder / "bare.log",
                    env=UPSTREAM_ENV,
                )
                servers.append(bare)
                bare.wait_healthy()
                targets.append(("bare", bare, ""))
            variants = (  # a literal \n in --extra-* is a line break (for make)
                (args.name_a, args.extra_a.replace("\\n", "\n"), args.gateway),
                (args.name_b, args.extra_b.replace("\\n", "\n"), args.gateway_b or args.gateway),
            )
            for name, extra, gateway in variants:
                server, key = start_gateway(
                    gateway, folder / name.replace(" ", "-"), mock.url + "/v1", True, extra
                )
                servers.append(server)
                targets.append((name, server, key))
            results = measure(args, targets, body, folder)
        finally:
            for server in reversed(servers):
                server.stop()
    report(args, results)


def measure(args, targets, body: Path, folder: Path) -> dict[str, list[tuple[float, float]]]:
    """Per target: (req/s, CPU ms per request) of each round."""
    results: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in targets}
    with (folder / "wrk.raw").open("w") as raw:
        for _ in range(args.rounds):
            for name, server, key in targets:
                url = server.url + SCENARIOS[args.scenario].path
                before = cpu_seconds(server.pid)
                result = run_wrk(
                    url, args.connections, args.seconds, "post.lua", [key, str(body)], raw
                )
                cpu_ms = (cpu_seconds(server.pid) - before) * 1000 / max(result.requests, 1)
                results[name].append((result.rps, cpu_ms))
    return results


def report(args, results) -> None:
    medians = {
        name: (statistics.median(r for r, _ in rounds), statistics.median(c for _, c in rounds))
        for name, rounds in results.items()
    }
    names = list(medians)
    base = "bare" if "bare" in medians else names[0]
    rps_base, cpu_base = medians[base]
    rounds = f"{args.rounds} alternating rounds of {args.seconds} s"
    print(f"{args.scenario}, {args.connections} connections, {rounds}; ratios to {base}")
    print("| variant | req/s (median) | CPU ms/request | req/s ÷ base, round by round |")
    print("|---|---:|---:|---:|")
    for name, (rps, cpu) in medians.items():
        ratios = (
            ("", "", "")
            if name == base
            else (
                f" ({rps / rps_base:.2f}x)",
                f" ({cpu / cpu_base:.2f}x)",
                _spread(results[name], results[base]),
            )
        )
        print(f"| {name} | {rps:,.0f}{ratios[0]} | {cpu:.3f}{ratios[1]} | {ratios[2]} |")


def _spread(rounds: list[tuple[float, float]], base: list[tuple[float, float]]) -> str:
    """Each round's req/s over the base's in the same round (its neighbour in time): their
    median and range. A range that straddles 1.00 is a difference the machine's noise
    can explain."""
    ratios = sorted(r / b for (r, _), (b, _) in zip(rounds, base, strict=True))
    return f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"


if __name__ == "__main__":
    main()
