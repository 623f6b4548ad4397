"""Load generation with wrk and the Lua scripts beside this file."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

BENCH_DIR = Path(__file__).resolve().parent
WRK_THREADS = 1  # one core for wrk, the other for the server under test


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int  # connect, read, write and timeout errors
    bad_status: int  # answers with HTTP status >= 400

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def wrk_version() -> str | None:
    """wrk's version, e.g. "wrk debian/4.1.0-3+b2", or None when wrk is not installed."""
    if shutil.which("wrk") is None:
        return None
    done = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    return " ".join((done.stdout + done.stderr).split()[:2])


def run_wrk(
    url: str,
    connections: int,
    seconds: int,
    script: str,
    args: list[str],
    raw: TextIO,
    on_tick: Callable[[], None] = lambda: None,
) -> WrkResult:
    """Run wrk for `seconds`, calling on_tick every 0.25 s meanwhile; log its output to raw."""
    argv = [
        "wrk",
        f"-t{WRK_THREADS}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        "10s",
        "-s",
        script,
        url,
        "--",
        *args,
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=BENCH_DIR
    )
    while True:
        try:
            proc.wait(0.25)
            break
        except subprocess.TimeoutExpired:
            on_tick()
    output = proc.communicate()[0]
    raw.write(f"$ {' '.join(argv)}\n{output}\n")
    line = next((x for x in output.splitlines() if x.startswith("BENCH ")), None)
    if proc.returncode != 0 or line is None:
        last = output.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"wrk exited with {proc.returncode}: {last[0].strip()}")
    stats = json.loads(line.removeprefix("BENCH "))
    return WrkResult(
        stats["requests"],
        stats["duration_us"] / 1e6,
        stats["p50_us"] / 1e3,
        stats["p90_us"] / 1e3,
        stats["p99_us"] / 1e3,
        stats["errors"],
        stats["bad_status"],
    )
