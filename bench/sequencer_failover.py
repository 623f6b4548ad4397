"""How long the transparency log goes without a sequencer, and how soon a receipt is proven.

Two real `gateway serve` instances on one PostgreSQL database (created here, dropped at
the end) share one secrets folder. Each round finds the sequencer through /healthz, then:

- kill: kill -9 of the sequencer; the time until the survivor's /healthz says it is the
  sequencer, and until a chat sent through the survivor right after the kill is proven;
- hang: SIGSTOP of the sequencer instead (its session is ended by the server after 5 s of
  silence), then SIGCONT; the same two times.

The killed instance is started again (it follows) before the next round. Then, steady
state: chat -> proof available, asked of the sequencer and of the follower (polling every
10 ms, so the times have 10 ms of resolution; chats at random phases of the 250 ms
integration tick).

    .venv/bin/python bench/sequencer_failover.py --kills 10 --hangs 3 --proofs 50
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from tests.storage.backends import postgres_database
from tests.support.gateway_process import GatewayProcess
from tests.support.http import bearer, chat_body

POLL_S = 0.01


def is_sequencer(process: GatewayProcess) -> bool:
    return httpx.get(process.url + "/healthz", timeout=5).json()["log"]["sequencer"]


def chat(process: GatewayProcess, key: str) -> str:
    response = httpx.post(
        process.url + "/v1/chat/completions", headers=bearer(key), json=chat_body(), timeout=30
    )
    response.raise_for_status()
    return response.headers["x-receipt-id"]


def proven(process: GatewayProcess, receipt_id: str) -> None:
    while httpx.get(f"{process.url}/api/proofs/{receipt_id}", timeout=5).status_code != 200:
        time.sleep(POLL_S)


def roles(processes: list[GatewayProcess]) -> tuple[GatewayProcess, GatewayProcess]:
    first, second = processes
    return (first, second) if is_sequencer(first) else (second, first)


def failover(processes, key: str, stop_signal: int) -> tuple[float, float]:
    """(seconds until the survivor sequences, seconds until its new receipt is proven)."""
    sequencer, survivor = roles(processes)
    proven(survivor, chat(survivor, key))  # both warm
    pid = sequencer.process.pid
    started = time.monotonic()
    os.killpg(pid, stop_signal)
    receipt_id = chat(survivor, key)
    while not is_sequencer(survivor):
        time.sleep(POLL_S)
    takeover = time.monotonic() - started
    proven(survivor, receipt_id)
    first_proof = time.monotonic() - started
    if stop_signal == signal.SIGSTOP:
        os.killpg(pid, signal.SIGCONT)
        while is_sequencer(sequencer):  # it finds its lock gone
            time.sleep(POLL_S)
    else:
        sequencer.process.wait()
        sequencer.start()  # back as a follower
    return takeover, first_proof


def proof_latency(process: GatewayProcess, key: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        time.sleep(random.uniform(0, 0.25))  # out of step with the integration tick
        started = time.monotonic()
        proven(process, chat(process, key))
        times.append(time.monotonic() - started)
    return times


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return (
        f"median {statistics.median(ordered) * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms,"
        f" max {ordered[-1] * 1000:.0f} ms (n={len(ordered)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--hangs", type=int, default=3)
    parser.add_argument("--proofs", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, postgres_database() as url:
        root = Path(tmp)
        (root / "secrets").mkdir()
        processes = []
        try:
            for name in ("a", "b"):
                (root / name).mkdir()
                process = GatewayProcess(
                    root / name, storage_url=url, secrets_dir=str(root / "secrets")
                )
                processes.append(process.start())
            project = processes[0].create_project("bench", "--balance", "100")
            key = processes[0].create_key(project, "inference,receipts")
            for name, rounds, sig in (
                ("kill -9", args.kills, signal.SIGKILL),
                ("SIGSTOP", args.hangs, signal.SIGSTOP),
            ):
                results = [failover(processes, key, sig) for _ in range(rounds)]
                if results:
                    print(f"{name}: takeover {summary([r[0] for r in results])}")
                    print(f"{name}: new receipt proven {summary([r[1] for r in results])}")
            sequencer, follower = roles(processes)
            for label, process in (("sequencer", sequencer), ("follower", follower)):
                print(f"chat -> proof, asked of the {label}: ", end="")
                print(summary(proof_latency(process, key, args.proofs)))
        finally:
            for process in processes:
                process.stop()


if __name__ == "__main__":
    main()
