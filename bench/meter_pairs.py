"""What a request's money costs in the meter alone: reserve + settle pairs from concurrent
tasks on one SQLite file, today's holds (`StorageMeter`) against leases (`LeasedMeter`),
in alternating rounds so that the machine's other load hits both alike. Prints CPU per
pair (this process: the loop and SQLite's thread) and pairs per second, and their ratios.

    python bench/meter_pairs.py --rounds 6 --tasks 32 --pairs 200
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model_gateway.gateway.metering.leased_meter import LeasedMeter
from model_gateway.gateway.metering.storage_meter import StorageMeter
from model_gateway.pipeline.context import Settlement
from model_gateway.storage import ProjectRecord, open_storage
from model_gateway.storage.base import KeyRecord

HOLD, COST = 600, 200


def settlement(n: int) -> Settlement:
    return Settlement(
        receipt_id=f"rcpt_bench{n}",
        request_id=f"req_{n}",
        kind="inference",
        endpoint="/v1/chat/completions",
        subject="echo-1",
        status="succeeded",
        usage={"input_tokens": 10, "output_tokens": 20},
        cost=COST,
        request_body=b'{"model":"echo-1"}',
        response_sha256=None,
        provider="echo",
    )


async def one_round(meter_class: type[StorageMeter], folder: Path, tasks: int, pairs: int):
    storage = await open_storage(f"sqlite:///{folder / meter_class.__name__}.db")
    await storage.create_project(ProjectRecord(id="prj_b", name="b"))
    key = KeyRecord(
        id="key_b", prefix="proj_live_bench0000", key_hash=b"h", project_id="prj_b",
        scopes=frozenset({"inference"}),
    )  # fmt: skip
    await storage.create_key(key)
    await storage.add_credit("prj_b", 10**12, "2026-11")
    meter = meter_class(storage)
    await meter.start()
    counter = iter(range(10**9))

    async def requests() -> None:
        for _ in range(pairs):
            hold = await meter.reserve("prj_b", "key_b", HOLD)
            await meter.settle(hold, settlement(next(counter)))

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(requests() for _ in range(tasks)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await meter.stop()
    await storage.close()
    return cpu / (tasks * pairs) * 1e6, tasks * pairs / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=200)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"holds": [], "leases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            for name, meter_class in (("holds", StorageMeter), ("leases", LeasedMeter)):
                folder = Path(tmp) / f"{name}{n}"
                folder.mkdir()
                results[name].append(
                    asyncio.run(one_round(meter_class, folder, args.tasks, args.pairs))
                )
    cpu = {name: statistics.median(c for c, _ in rows) for name, rows in results.items()}
    rate = {name: statistics.median(r for _, r in rows) for name, rows in results.items()}
    print(f"{args.tasks} tasks x {args.pairs} reserve+settle pairs, {args.rounds} rounds")
    print("| meter | CPU us/pair (median) | pairs/s (median) |\n|---|---:|---:|")
    print(f"| holds | {cpu['holds']:.1f} | {rate['holds']:,.0f} |")
    print(
        f"| leases | {cpu['leases']:.1f} ({cpu['leases'] / cpu['holds']:.2f}x) |"
        f" {rate['leases']:,.0f} ({rate['leases'] / rate['holds']:.2f}x) |"
    )


if __name__ == "__main__":
    main()
