"""Instructions per metered request, counted by valgrind: a measure of small changes that
the machine's noise cannot move (wrk rounds on these VMs vary by ±10%, so a change worth
2% never shows in them).

The gateway's ASGI app runs in this process, with the built-in echo provider and SQLite on
a real file, on uvloop as `gateway serve` runs it: no sockets, no other process. (On
asyncio's own loop, whose scheduling is Python code, a change that saves tasks or loop
turns counts far larger than it is served: one task less a request counted 0.942x there
and 0.996x on uvloop.) The script runs `--requests` chat completions (`--stream`:
streamed), `--tasks` at a time, through the whole chain (key, limits, hold, settlement,
receipt, log), and prints nothing else. Run under callgrind twice, with N and 2N
requests, the difference of the two totals over N is what one request costs, start-up and
shutdown cancelled out:

    apt-get install -y valgrind
    python bench/instructions.py [--other ../other/.venv/bin/python] [--repeats 3]

counts this checkout (and another's, alternating) and prints the median and range of the
repeats: 1-5% apart on the same code, and the medians of two runs of the same code up to
7% apart (the log's batches and the loop's turns follow the clock, which valgrind slows
50 times): compare two codes within one run, and back a difference under 5% with a
microbenchmark. About a minute a count. Instruction counts are
the user-space work of the event loop's thread only: system calls, cache misses and waits
are not in them, so confirm a change that counts fewer with `bench/paired.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import uvloop

# The repository's own config.toml, as `make run` serves it: SQLite and the echo provider.
CONFIG = Path(__file__).resolve().parent.parent / "config.toml"
HIGH_RPM = "100000000"
BODY = b'{"model":"echo-1","max_tokens":64,"messages":[{"role":"user","content":"Say hi."}]}'
# The same request streamed, its usage asked for (the echo provider sends an event a word).
STREAM_BODY = BODY[:-1] + b',"stream":true,"stream_options":{"include_usage":true}}'


async def run(folder: Path, requests: int, tasks: int, stream: bool) -> None:
    from model_gateway.gateway.app import create_app
    from model_gateway.gateway.config import load_config

    app = create_app(load_config(folder / "config.toml"))
    key = (folder / "key").read_text().strip()
    body = STREAM_BODY if stream else BODY
    headers = [
        (b"authorization", b"Bearer " + key.encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]

    async def one() -> None:
        sent: list[dict] = []
        delivered = False

        async def receive() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client stays until the answer ends
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions", "root_path": "", "query_string": b"",
            "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080),
        }  # fmt: skip
        await app(scope, receive, send)
        status = sent[0]["status"]
        if status != 200:
            raise SystemExit(f"a request was answered {status}: {sent[-1].get('body')!r}")

    async def worker(count: int) -> None:
        for _ in range(count):
            await one()

    async with app.lifespan():
        share, extra = divmod(requests, tasks)
        await asyncio.gather(*(worker(share + (n < extra)) for n in range(tasks)))


def provision(folder: Path, gateway: Path) -> None:
    """A config, a funded project and a key, made with the CLI as an operator would."""
    shutil.copyfile(CONFIG, folder / "config.toml")  # its paths resolve in `folder`

    def cli(*args: str) -> str:
        argv = [str(gateway), *args, "--json", "--config", str(folder / "config.toml")]
        done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=folder)
        return done.stdout

    created = cli("projects", "create", "bench", "--balance", "1000000", "--rpm", HIGH_RPM)
    project = json.loads(created)["id"]
    made = cli("keys", "create", "--project", project, "--scopes", "inference", "--rpm", HIGH_RPM)
    key = json.loads(made)
    (folder / "key").write_text(key["key"])


def count(python: Path, folder: Path, requests: int, tasks: int, stream: bool) -> int:
    """Instructions (callgrind's Ir) of one run of this script with `requests` requests."""
    out = folder / f"callgrind.{requests}.out"
    valgrind = ["valgrind", "--tool=callgrind", "--separate-threads=yes"]
    script = [str(python), __file__, "--folder", str(folder), "--requests", str(requests)]
    script += ["--stream"] if stream else []
    argv = [*valgrind, f"--callgrind-out-file={out}", *script, "--tasks", str(tasks)]
    subprocess.run(argv, check=True, capture_output=True, cwd=folder)
    # The event loop's thread only: SQLite's checkpoints run on a thread of their own once a
    # second, and a run under valgrind lasts long enough for their number to vary.
    main = out.with_name(out.name + "-01")
    summary = re.search(r"^summary:\s+(\d+)", main.read_text(errors="replace"), re.MULTILINE)
    if summary is None:
        raise SystemExit(f"no summary in {main}")
    return int(summary.group(1))


def per_request(python: Path, requests: int, tasks: int, stream: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # A fresh database for each count: the same file grown by the first run would
        # make the second's b-trees deeper than the first's.
        totals = []
        for n in (requests, 2 * requests):
            shutil.rmtree(folder / "data", ignore_errors=True)
            provision(folder, python.with_name("gateway"))
            totals.append(count(python, folder, n, tasks, stream))
        return (totals[1] - totals[0]) / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, help="run the requests (what valgrind runs)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--other", type=Path, help="another checkout's venv python")
    parser.add_argument("--stream", action="store_true", help="streamed chat completions")
    args = parser.parse_args()
    if args.folder is not None:
        # the loop `gateway serve` runs
        uvloop.run(run(args.folder, args.requests, args.tasks, args.stream))
        return
    pythons = {"this checkout": Path(sys.executable)}
    if args.other is not None:
        pythons["other"] = args.other
    counts: dict[str, list[float]] = {name: [] for name in pythons}
    for _ in range(args.repeats):
        for name, python in pythons.items():
            counts[name].append(per_request(python, args.requests, args.tasks, args.stream))
    base = statistics.median(counts["this checkout"])
    kind = "streamed " if args.stream else ""
    print(f"instructions a {kind}request, event loop's thread, {args.tasks} requests at a time:")
    for name, values in counts.items():
        median = statistics.median(values)
        ratio = f", {median / base:.3f}x this checkout" if name != "this checkout" else ""
        print(f"- {name}: {median:,.0f} ({min(values):,.0f}-{max(values):,.0f}){ratio}")


if __name__ == "__main__":
    main()
