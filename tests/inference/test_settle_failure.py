"""A settlement that fails (another connection holds the database's write lock past the
busy timeout, as in the hardening report) leaves no hold behind: the stream is cut before
its end ([DONE] never arrives), nothing is charged, no receipt exists, and once the lock
goes the hold is released (hardening item 4)."""

from __future__ import annotations

import sqlite3
import time
from decimal import Decimal

import httpx

from tests.support.http import bearer


def account(gw, project: str) -> tuple[Decimal, Decimal]:
    shown = gw.cli("projects", "show", project)
    return Decimal(shown["balance"]), Decimal(shown["reserved"])


def test_a_settlement_that_cannot_commit_releases_its_hold(gw):
    project = gw.create_project("settle-lock", "--balance", "1")
    key = gw.create_key(project, "inference,receipts")
    body = {
        "model": "oa/slow-stream",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    locker = sqlite3.connect(gw.folder / "data" / "gateway.db", timeout=30, isolation_level=None)
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json=body, headers=bearer(key)) as stream:
            receipt = stream.headers["x-receipt-id"]
            chunks = stream.iter_bytes()
            next(chunks)  # the first event: the hold is taken, the rest comes after a pause
            # Read in-process, not through the CLI: a loaded machine may take longer to
            # start a CLI than the upstream's pause lasts.
            held = locker.execute("SELECT reserved FROM projects WHERE id = ?", (project,))
            assert held.fetchone()[0] > 0
            locker.execute("BEGIN IMMEDIATE")  # the write lock, past the busy timeout (5 s)
            try:
                rest = b""
                try:
                    for chunk in chunks:
                        rest += chunk
                except httpx.HTTPError:
                    pass  # the response was cut: it could not be billed
                assert b"[DONE]" not in rest
            finally:
                time.sleep(1)
                locker.execute("ROLLBACK")
        deadline = time.monotonic() + 15
        while account(gw, project) != (Decimal(1), Decimal(0)):
            assert time.monotonic() < deadline, account(gw, project)
            time.sleep(0.2)
        # While the lock was held the instance could not renew its lease either: it may
        # answer 503 until its next renewal, then the receipt is known not to exist.
        while (
            lookup := http.get(f"/v1/receipts/{receipt}", headers=bearer(key))
        ).status_code == 503:
            assert time.monotonic() < deadline + 15, lookup.text
            time.sleep(0.2)
        assert lookup.status_code == 404, lookup.text
    locker.close()
