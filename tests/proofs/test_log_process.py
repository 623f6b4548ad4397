"""`gateway serve` integrates the transparency log in a child process with `[proofs]
log_process = true`: the child holds the sequencer lock, the gateway follows and serves
proofs; if the child dies the gateway's own log takes over; at shutdown the child goes
too. Off (the default), there is no child."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import httpx
import pytest

from model_gateway.gateway.proofs.log_process import LogProcess
from model_gateway.storage import open_storage
from tests.support.gateway_process import GatewayProcess
from tests.support.http import bearer, chat_body
from tests.support.records import offering_meter

CHILD_MODULE = b"model_gateway.gateway.proofs.log_process"


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def log_children(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        try:
            if CHILD_MODULE in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except FileNotFoundError:  # it exited meanwhile
            continue
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def serving(tmp_path):
    with GatewayProcess(tmp_path, extra_config="\n[proofs]\nlog_process = true\n") as gateway:
        project = gateway.create_project("t", "--balance", "10")
        gateway.key = gateway.create_key(project, "inference")
        yield gateway


def proven(gateway: GatewayProcess, http: httpx.Client) -> dict:
    """A new chat's receipt, once the log has it (at most 15 s)."""
    answer = http.post("/v1/chat/completions", json=chat_body(), headers=bearer(gateway.key))
    assert answer.status_code == 200
    receipt_id = answer.headers["x-receipt-id"]
    deadline = time.monotonic() + 15
    while (proof := http.get(f"/api/proofs/{receipt_id}")).status_code != 200:
        assert time.monotonic() < deadline, f"never logged: {proof.status_code} {proof.text}"
        time.sleep(0.1)
    return proof.json()


def sequencer_here(http: httpx.Client) -> bool:
    return http.get("/healthz").json()["log"]["sequencer"]


def test_the_child_logs_and_the_gateway_serves_the_proofs(serving):
    [child] = log_children(serving.process.pid)
    with httpx.Client(base_url=serving.url, timeout=10) as http:
        first = proven(serving, http)
        assert first["receipt"]["id"] and log_children(serving.process.pid) == [child]
        assert sequencer_here(http)  # its child's lock counts as the gateway's
        assert "gateway_log_sequencer 1.0" in http.get("/metrics").text
    assert "this process integrates the log" not in serving.log()


def test_the_child_is_fed_the_receipts_and_reads_none_back(serving):
    """The gateway hands each committed receipt to the child over its stdin, as it does to
    its own log: the child takes only their ids and order from storage."""
    with httpx.Client(base_url=serving.url, timeout=10) as http:
        for _ in range(5):
            proven(serving, http)
        gauges = dict(
            line.split(" ")
            for line in http.get("/metrics").text.splitlines()
            if line.startswith("gateway_log_")
        )
    assert float(gauges["gateway_log_size"]) >= 5
    assert float(gauges["gateway_log_read_back"]) == 0
    assert float(gauges["gateway_log_integration_lag_seconds"]) < 5


def test_when_the_child_dies_the_gateway_logs_on_its_own(serving):
    [child] = log_children(serving.process.pid)
    os.kill(child, signal.SIGKILL)
    with httpx.Client(base_url=serving.url, timeout=10) as http:
        proven(serving, http)
        later = proven(serving, http)
        assert sequencer_here(http)  # its own log now
    assert later["tree_head"]["size"] >= 2 and not alive(child)
    assert "this process integrates now" in serving.log()


def test_the_child_stops_with_the_gateway(serving):
    [child] = log_children(serving.process.pid)
    os.kill(serving.process.pid, signal.SIGTERM)  # the gateway alone, not its process group
    serving.process.wait(timeout=15)
    deadline = time.monotonic() + 5
    while alive(child):
        assert time.monotonic() < deadline, "the log process outlived the gateway"
        time.sleep(0.05)


def test_by_default_the_gateway_logs_alone(tmp_path):
    with GatewayProcess(tmp_path) as gateway:
        project = gateway.create_project("t", "--balance", "10")
        gateway.key = gateway.create_key(project, "inference")
        assert log_children(gateway.process.pid) == []
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            proven(gateway, http)


def test_the_gateway_reads_only_the_childs_reports(tmp_path):
    """A stray line on the child's stdout (a library printing) never stops the gateway."""
    child = LogProcess("sqlite:///unused.db", tmp_path / "key", "origin", "text")
    child._read(b"something else\n")
    assert (child.sequencer, child.size) == (False, 0)
    child._read(b'{"sequencer":true,"size":3,"read_back":2}\n')
    assert (child.sequencer, child.size, child.read_back) == (True, 3, 2)


async def test_a_stop_cancelled_by_an_anyio_scope_still_ends_the_child(tmp_path):
    url = f"sqlite:///{tmp_path}/gateway.db"
    child = LogProcess(url, tmp_path / "signing-key", "gateway.local/log", "text")
    await child.start()
    assert child.sequencer and alive(child.process.pid)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await child.stop()
    assert child.process.returncode is not None and not child.sequencer


async def test_receipts_fed_just_before_a_stop_are_logged_from_the_feed(tmp_path):
    """The last receipts settled before the stop go to the child before its pipe closes,
    and the child reads them to the end before its last integration: none read back."""
    url = f"sqlite:///{tmp_path}/gateway.db"
    child = LogProcess(url, tmp_path / "signing-key", "gateway.local/log", "text")
    await child.start()
    storage = await open_storage(url)
    try:
        charge = await offering_meter(storage, child.offer)
        settled = [await charge() for _ in range(5)]  # well within the feed's 100 ms
        await child.stop()
        logged = await storage.log_entry_receipts(0, 5)
        assert [receipt.id for _, receipt in logged] == settled
        assert child.read_back == 0  # its last report, after its last integration
    finally:
        await storage.close()
