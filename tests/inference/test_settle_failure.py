"""A settlement that fails (another connection holds the database's write lock past the
busy timeout, as in the hardening report) leaves no hold behind: nothing is charged, no
receipt exists, and once the lock goes the hold is released (hardening item 4). A stream
is cut before its end ([DONE] never arrives); a whole response never starts: its head
waits for the settlement (pipeline/settle.py), so the client gets 500 internal_error."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from decimal import Decimal

import httpx
import pytest

from tests.inference.conftest import _start
from tests.support.errors import assert_error
from tests.support.http import bearer


@pytest.fixture(scope="module")
def gw(tmp_path_factory, fake_openai, fake_anthropic):
    """A gateway of this module's own: holding its database's write lock past the busy
    timeout also fences it (its lease cannot be renewed), which must not reach the tests
    that share the session's gateway (they were answered 503 when they came next)."""
    process = _start(tmp_path_factory.mktemp("settle-lock"), (fake_openai, fake_anthropic), 30)
    yield process
    process.stop()


def account(gw, project: str) -> tuple[Decimal, Decimal]:
    shown = gw.cli("projects", "show", project)
    return Decimal(shown["balance"]), Decimal(shown["reserved"])


@contextmanager
def write_lock_once_held(gw, project: str):
    """Once the project's hold is taken, the database's write lock, past the busy timeout
    (5 s), until the block ends and a second after."""
    locker = sqlite3.connect(gw.folder / "data" / "gateway.db", timeout=30, isolation_level=None)
    # Read in-process, not through the CLI: a loaded machine may take longer to start a
    # CLI than the upstream's pause lasts.
    reserved = "SELECT reserved FROM projects WHERE id = ?"
    deadline = time.monotonic() + 10
    while not locker.execute(reserved, (project,)).fetchone()[0]:
        assert time.monotonic() < deadline, "the hold was never taken"
        time.sleep(0.01)
    locker.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        time.sleep(1)
        locker.execute("ROLLBACK")
        locker.close()


def wait_released_and_unbilled(gw, project: str) -> float:
    """Once the balance is whole and nothing is reserved; the deadline for what follows."""
    deadline = time.monotonic() + 15
    while account(gw, project) != (Decimal(1), Decimal(0)):
        assert time.monotonic() < deadline, account(gw, project)
        time.sleep(0.2)
    return deadline


def assert_released_and_unbilled(gw, http: httpx.Client, project: str, key: str, receipt: str):
    deadline = wait_released_and_unbilled(gw, project)
    # While the lock was held the instance could not renew its lease either: it may
    # answer 503 until its next renewal, then the receipt is known not to exist.
    while (lookup := http.get(f"/v1/receipts/{receipt}", headers=bearer(key))).status_code == 503:
        assert time.monotonic() < deadline + 15, lookup.text
        time.sleep(0.2)
    assert lookup.status_code == 404, lookup.text


def chat(model: str, stream: bool) -> dict:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


def test_a_stream_whose_settlement_cannot_commit_is_cut_and_its_hold_released(gw):
    project = gw.create_project("settle-lock", "--balance", "1")
    key = gw.create_key(project, "inference,receipts")
    body = chat("oa/slow-stream", stream=True)
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json=body, headers=bearer(key)) as stream:
            receipt = stream.headers["x-receipt-id"]
            chunks = stream.iter_bytes()
            next(chunks)  # the first event: the hold is taken, the rest comes after a pause
            with write_lock_once_held(gw, project):
                rest = b""
                try:
                    for chunk in chunks:
                        rest += chunk
                except httpx.HTTPError:
                    pass  # the response was cut: it could not be billed
                assert b"[DONE]" not in rest
        assert_released_and_unbilled(gw, http, project, key, receipt)


def test_a_whole_response_whose_settlement_cannot_commit_is_never_sent(gw):
    project = gw.create_project("settle-lock-whole", "--balance", "1")
    key = gw.create_key(project, "inference")
    answers: list[httpx.Response] = []
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        asking = threading.Thread(  # the upstream answers after 3 s: the lock comes first
            target=lambda: answers.append(
                http.post("/v1/chat/completions", json=chat("oa/slow", False), headers=bearer(key))
            )
        )
        asking.start()
        with write_lock_once_held(gw, project):
            asking.join(30)
    (answer,) = answers
    assert_error(answer, 500, "internal_error")
    assert "x-receipt-id" not in answer.headers  # the receipt it would have had never was
    wait_released_and_unbilled(gw, project)
    with sqlite3.connect(gw.folder / "data" / "gateway.db") as db:
        stored = db.execute("SELECT count(*) FROM receipts WHERE project_id = ?", (project,))
        assert stored.fetchone()[0] == 0
