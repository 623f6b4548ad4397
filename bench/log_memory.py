"""The transparency log's memory and storage per receipt, old layout against tiles.

    python bench/log_memory.py [--leaves 200000] [--keep DIR]

1. Settles N receipts into a fresh SQLite database with the gateway's own meter (a hold,
   then its receipt: the triggers charge the ledger), 256 requests at a time, so that only
   the log is measured afterwards.
2. Before (the layout up to migration 0005): the whole Merkle tree in memory
   (merkle.MerkleTree, what the old integrator kept) and, in a copy of the database, a
   log_leaves row per receipt with its public receipt and its Ed25519 signature.
3. After: the real TransparencyLog integrating every receipt in 256-receipt batches
   into tiles, Python heap traced with tracemalloc before and after, and at every 50k.
4. Bytes per receipt of each database file after a WAL checkpoint (indexes included),
   with the tables that hold them (SQLite's dbstat).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import secrets
import shutil
import sqlite3
import tempfile
import time
import tracemalloc
from pathlib import Path

from model_gateway.gateway.metering.storage_meter import StorageMeter, current_month
from model_gateway.gateway.proofs.log import TransparencyLog, public_receipt
from model_gateway.gateway.proofs.log_key import SigningKey
from model_gateway.gateway.proofs.merkle import MerkleTree, leaf_hash
from model_gateway.gateway.proofs.receipts import canonical_bytes, sign_receipt
from model_gateway.pipeline.context import Settlement
from model_gateway.storage import ProjectRecord, open_storage
from model_gateway.storage.sqlite import _receipt as receipt_of_row

KEY = SigningKey.generate()
CHUNK = 20_000
CONCURRENT = 256  # requests settled at a time (group-committed together)


async def settle_receipts(path: Path, count: int) -> None:
    """N billed chats, settled by the gateway's own meter (a hold, then its receipt), a
    batch of concurrent requests at a time."""
    storage = await open_storage(f"sqlite:///{path}")
    meter = StorageMeter(storage)
    project = "prj_" + secrets.token_hex(8)
    await storage.create_project(ProjectRecord(id=project, name="bench"))
    await storage.add_credit(project, 10**15, current_month())

    async def one() -> None:
        hold = await meter.reserve(project, None, 2000)
        await meter.settle(hold, settlement())

    for start in range(0, count, CONCURRENT):
        await asyncio.gather(*(one() for _ in range(min(CONCURRENT, count - start))))
    await storage.close()


def settlement() -> Settlement:
    return Settlement(
        receipt_id="rcpt_" + secrets.token_hex(14), request_id="req_" + secrets.token_hex(12),
        kind="inference", endpoint="/v1/chat/completions", subject="echo-1",
        status="succeeded", usage={"input_tokens": 12, "output_tokens": 34}, cost=1234,
        request_body=secrets.token_bytes(200), response_sha256=secrets.token_hex(32),
    )  # fmt: skip


def file_bytes(path: Path) -> int:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return path.stat().st_size


def table_bytes(path: Path) -> dict[str, int]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
    except sqlite3.OperationalError:  # dbstat not compiled in
        return {}
    finally:
        db.close()
    return dict(rows)


def receipts_of(path: Path):
    """The stored receipts in settlement order, a chunk at a time (flat memory here too)."""
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    cursor = db.execute("SELECT * FROM receipts ORDER BY seq")
    while rows := cursor.fetchmany(CHUNK):
        yield [receipt_of_row(r) for r in rows]
    db.close()


def before(path: Path, count: int) -> dict:
    """The old integrator's state: the whole tree in memory, and a copy of the public
    receipt and a signature stored per leaf."""
    db = sqlite3.connect(path, isolation_level=None)
    hashes: list[bytes] = []
    for records in receipts_of(path):
        rows = []
        for r in records:
            receipt = public_receipt(r)
            leaf = canonical_bytes(receipt)
            rows.append((len(hashes), r.id, leaf, sign_receipt(KEY, receipt)))
            hashes.append(leaf_hash(leaf))
        db.execute("BEGIN")
        db.executemany("INSERT INTO log_leaves VALUES (?, ?, ?, ?)", rows)
        db.execute("COMMIT")
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tree = MerkleTree(hashes)
    gc.collect()
    tree_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert tree.size == count
    db.execute(
        "INSERT INTO tree_heads VALUES (?, ?, '2026-11-23T00:00:00.000000Z', ?, ?)",
        (count, tree.root().hex(), KEY.key_id, "00" * 64),
    )
    db.close()
    return {"tree_bytes": tree_bytes}


async def after(path: Path, count: int) -> dict:
    storage = await open_storage(f"sqlite:///{path}")
    log = TransparencyLog(storage, KEY, interval_s=3600)
    await log.start()
    log._task.cancel()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    samples = []
    started = time.perf_counter()
    while await log.integrate():
        if log.size % 50_000 < log.batch:
            gc.collect()
            samples.append((log.size, tracemalloc.get_traced_memory()[0] - base))
    elapsed = time.perf_counter() - started
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - base
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    edge = sum(len(t) for t in log._edge.tiles().values())
    assert log.size == count, log.size
    # A proof from tiles, timed (the old tree answered from memory).
    receipt_id = (await storage.log_entry_receipts(count // 2, count // 2 + 1))[0][1].id
    t0 = time.perf_counter()
    for _ in range(100):
        await log.proof(receipt_id)
    proof_ms = (time.perf_counter() - t0) * 10
    await log.stop()
    await storage.close()
    return {
        "retained": retained,
        "peak": peak,
        "samples": samples,
        "edge": edge,
        "integrate_s": elapsed,
        "proof_ms": proof_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--leaves", type=int, default=200_000)
    parser.add_argument("--keep", help="keep the databases in this folder")
    args = parser.parse_args()
    n = args.leaves
    folder = Path(args.keep or tempfile.mkdtemp(prefix="log-memory-"))
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / "base.db"
    for p in folder.glob("*.db*"):
        p.unlink()

    async def create() -> None:
        await (await open_storage(f"sqlite:///{base}")).close()  # migrations

    asyncio.run(create())
    asyncio.run(settle_receipts(base, n))
    base_size = file_bytes(base)
    old, new = folder / "before.db", folder / "after.db"
    shutil.copy(base, old)
    shutil.copy(base, new)
    b = before(old, n)
    a = asyncio.run(after(new, n))
    old_size, new_size = file_bytes(old), file_bytes(new)
    old_tables, new_tables = table_bytes(old), table_bytes(new)

    mib = 2**20
    print(f"# transparency log, {n} receipts ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs)")
    print()
    print("| | before (tree in memory, leaves stored) | after (tiles) |")
    print("|---|---|---|")
    print(
        f"| Python heap held by the log | {b['tree_bytes'] / mib:.1f} MiB"
        f" ({b['tree_bytes'] / n:.1f} B/receipt) | {a['retained'] / 1024:.1f} KiB"
        f" (right edge: {a['edge']} B of partial tiles) |"
    )
    print(f"| peak during integration | | {a['peak'] / mib:.2f} MiB |")
    print(
        f"| log bytes per receipt in the file | {(old_size - base_size) / n:.0f}"
        f" | {(new_size - base_size) / n:.0f} |"
    )
    print(f"| whole database per receipt | {old_size / n:.0f} | {new_size / n:.0f} |")
    print(f"| integration (slowed by tracemalloc) | | {n / a['integrate_s']:.0f} receipts/s |")
    print(f"| one proof (tiles read from SQLite) | | {a['proof_ms']:.2f} ms |")
    print()
    print("heap held by the tiled log as it grows (leaves: bytes):")
    print("  " + ", ".join(f"{size}: {held}" for size, held in a["samples"]))
    if new_tables:
        print()
        print("bytes per receipt by table or index (after):")
        for name, size in sorted(new_tables.items(), key=lambda kv: -kv[1]):
            if size / n >= 0.5:
                print(f"  {name}: {size / n:.1f}")
        print(
            "log tables before: "
            + ", ".join(
                f"{k} {v / n:.1f}"
                for k, v in old_tables.items()
                if k.startswith(("log_", "sqlite_autoindex_log"))
            )
        )
    if not args.keep:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
