"""What a request's SQL costs, statement by statement, counted by valgrind.

A hold and its settlement are written the way the group commit writes them at 32
connections: 32 holds in one transaction, then their 32 receipts in the next, on a real
database made by the CLI (the repository's config.toml). The script counts instructions
(callgrind's Ir, R and then 2R rounds, the difference over 32R requests: start-up cancels
out) for the schema as it is, then for variants of it, each on a fresh copy:

- without each statement of the settlement's trigger (`receipt_charges`), in turn;
- "one append": the trigger gone, and what it did folded once per batch (the upper bound
  of the issue's "settlement as one append": the holds' deletes, the balance, the month's
  spend, the ledger rows and the keys' last use, one statement each for the whole batch);
- no triggers and no foreign keys at all (the rows and their indexes alone).

    apt-get install -y valgrind
    python bench/sql_counts.py [--rounds 20]

About 30 s a variant, 6 minutes in all. The rows' Python (ids, packing) is in every count
alike, about 30 K.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from instructions import provision

BATCH = 32
HOLD = (
    "INSERT INTO reservations (id, project_id, key_id, amount, month, owner, lease_until,"
    " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
# As storage/sqlite/ writes a receipt, its shape already known.
RECEIPT = (
    "INSERT INTO receipt_rows (id, reservation_id, project_id, key_id, request_id, shape,"
    " input_tokens, output_tokens, usage_rest, cost, month, created_at, request_sha256,"
    " response_sha256, request_salt, response_salt, request_commitment, response_commitment)"
    " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
    " WHERE EXISTS (SELECT 1 FROM reservations WHERE id = ? AND project_id = ? AND amount >= ?)"
)
# "One append": what receipt_charges does row by row, once for the batch's receipts.
FOLD = [
    "DELETE FROM reservations WHERE lease = 0 AND id IN (SELECT 'rsv_' || lower(hex("
    "reservation_id)) FROM receipt_rows WHERE seq > :last)",
    "UPDATE projects SET balance = balance - s.total FROM (SELECT 'prj_' || lower(hex("
    "project_id)) AS id, sum(cost) AS total FROM receipt_rows WHERE seq > :last"
    " GROUP BY project_id) s WHERE projects.id = s.id",
    "INSERT INTO month_spend (subject, month, spent)"
    " SELECT 'prj_' || lower(hex(project_id)), :month, sum(cost) FROM receipt_rows"
    " WHERE seq > :last GROUP BY project_id UNION ALL"
    " SELECT 'key_' || lower(hex(key_id)), :month, sum(cost) FROM receipt_rows"
    " WHERE seq > :last AND key_id IS NOT NULL GROUP BY key_id"
    " ON CONFLICT (subject, month) DO UPDATE SET spent = spent + excluded.spent",
    "INSERT INTO ledger (kind, receipt) SELECT 'charge', seq FROM receipt_rows WHERE seq > :last",
    "UPDATE api_keys SET last_used_us = s.at FROM (SELECT 'key_' || lower(hex(key_id)) AS id,"
    " max(created_at) AS at FROM receipt_rows WHERE seq > :last AND key_id IS NOT NULL"
    " GROUP BY key_id) s WHERE api_keys.id = s.id",
]


def write(db: Path, rounds: int, setup: list[str], fold: bool) -> None:
    """The measured work (run under valgrind): `rounds` batches of holds, then receipts."""
    from model_gateway.storage.sqlite import _pack, _pragmas

    conn = sqlite3.connect(db, isolation_level=None)
    for pragma in (*_pragmas(5.0), "wal_autocheckpoint = 0"):
        conn.execute(f"PRAGMA {pragma}")
    for statement in setup:
        conn.execute(statement)
    project, key = conn.execute("SELECT project_id, id FROM api_keys").fetchone()
    shape = conn.execute(
        "INSERT INTO receipt_shapes (kind, endpoint, model_or_runtime, status, usage_source,"
        " provider) VALUES ('inference', '/v1/chat/completions', 'echo-1', 'succeeded',"
        " 'provider', 'local') RETURNING id"
    ).fetchone()[0]
    month = time.strftime("%Y-%m")
    for _ in range(rounds):
        holds = ["rsv_" + secrets.token_hex(12) for _ in range(BATCH)]
        now = int(time.time())
        conn.execute("BEGIN IMMEDIATE")
        for hold in holds:
            conn.execute(HOLD, (hold, project, key, 100, month, "bench", now + 60, now))
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        last = conn.execute("SELECT coalesce(max(seq), 0) FROM receipt_rows").fetchone()[0]
        for hold in holds:
            conn.execute(
                RECEIPT,
                (
                    _pack("rcpt_", "rcpt_" + secrets.token_hex(14)),
                    _pack("rsv_", hold),
                    _pack("prj_", project),
                    _pack("key_", key),
                    _pack("req_", "req_" + secrets.token_hex(12)),
                    shape, 3, 5, None, 4, None, time.time_ns() // 1000,
                    os.urandom(32), os.urandom(32), os.urandom(16), os.urandom(16),
                    os.urandom(32), None, hold, project, 4,
                ),
            )  # fmt: skip
        for statement in FOLD if fold else []:
            conn.execute(statement, {"last": last, "month": month})
        conn.execute("COMMIT")
    written = conn.execute("SELECT count(*) FROM receipt_rows").fetchone()[0]
    if written != rounds * BATCH:
        raise SystemExit(f"{written} receipts written, not {rounds * BATCH}")


def trigger_statements(db: Path, name: str) -> tuple[str, list[str]]:
    """A trigger's head (up to BEGIN) and its statements."""
    sql = (
        sqlite3.connect(db)
        .execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (name,))
        .fetchone()[0]
    )
    head, body = sql.split("BEGIN", 1)
    return head, [s.strip() for s in body.rsplit("END", 1)[0].split(";") if s.strip()]


def variants(db: Path) -> dict[str, tuple[list[str], bool]]:
    head, statements = trigger_statements(db, "receipt_charges")
    drop = "DROP TRIGGER receipt_charges"
    found: dict[str, tuple[list[str], bool]] = {"as is": ([], False)}
    for n, statement in enumerate(statements):
        rest = ";\n".join(s for i, s in enumerate(statements) if i != n)
        label = f"without {n + 1}: " + re.sub(r"\s+", " ", statement)[:50]
        found[label] = ([drop, f"{head}BEGIN\n{rest};\nEND"], False)
    found["one append (the trigger folded per batch)"] = ([drop], True)
    triggers = sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
    no_triggers = ["PRAGMA foreign_keys = OFF", *(f"DROP TRIGGER {n}" for (n,) in triggers)]
    found["no triggers, no foreign keys"] = (no_triggers, False)
    return found


def count(folder: Path, rounds: int, setup: list[str], fold: bool) -> int:
    run = folder / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(folder / "data", run)
    out = folder / "callgrind.out"
    argv = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
        sys.executable, __file__, "--db", str(run / "gateway.db"), "--rounds", str(rounds),
        *(["--fold"] if fold else []), *[arg for s in setup for arg in ("--setup", s)],
    ]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True)
    summary = re.search(r"^summary:\s+(\d+)", out.read_text(), re.MULTILINE)
    if summary is None:
        raise SystemExit(f"no summary in {out}")
    return int(summary.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--db", type=Path, help="write to this database (what valgrind runs)")
    parser.add_argument("--setup", action="append", default=[])
    parser.add_argument("--fold", action="store_true")
    args = parser.parse_args()
    if args.db is not None:
        write(args.db, args.rounds, args.setup, args.fold)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        provision(folder, Path(sys.executable).with_name("gateway"))
        found = variants(folder / "data" / "gateway.db")
        print(f"instructions a request (a hold and its receipt, batches of {BATCH}):")
        base = None
        for label, (setup, fold) in found.items():
            totals = [count(folder, r, setup, fold) for r in (args.rounds, 2 * args.rounds)]
            each = (totals[1] - totals[0]) / (args.rounds * BATCH)
            base = base or each
            print(f"- {label}: {each:,.0f} ({each - base:+,.0f})")


if __name__ == "__main__":
    main()
