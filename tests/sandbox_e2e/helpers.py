"""Helpers for tests over real processes: a `gateway sandbox-node`, tenants made by the CLI."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from tests.support.gateway_process import GATEWAY, GatewayProcess, free_port
from tests.support.processes import listens_on, live_processes

PER_EXECUTION = Decimal("0.001")
PER_SECOND = Decimal("0.01")
SLOT_UID_BASE = 20000


def sandbox_config(
    url: str, secret_file: Path | str, *, max_concurrent: int = 1, spawn: bool = False
) -> str:
    return f"""
[sandbox_node]
url = "{url}"
secret_file = "{secret_file}"
max_concurrent = {max_concurrent}
spawn = {"true" if spawn else "false"}

[sandbox_pricing]
per_execution = "{PER_EXECUTION}"
per_second = "{PER_SECOND}"
"""


class NodeProcess:
    """`gateway sandbox-node --config F` with its own config file."""

    def __init__(self, folder: Path, *, max_concurrent: int = 1) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret_file = folder / "sandbox-secret"
        self.config_path = folder / "node.toml"
        self.config_path.write_text(
            sandbox_config(self.url, self.secret_file, max_concurrent=max_concurrent)
        )
        self.log_path = folder / "node.log"
        self.process: subprocess.Popen | None = None
        self.isolation: dict = {}

    def start(self) -> NodeProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [GATEWAY, "sandbox-node", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"node exited at start-up:\n{self.log_path.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                answer = httpx.get(self.url + "/healthz", timeout=1)
                if answer.status_code == 200 and listens_on(self.process.pid, self.port):
                    self.isolation = answer.json()["isolation"]
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"node did not answer /healthz:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextlib.contextmanager
def running_node(folder: Path, slots: int):
    """A started node, stopped on exit."""
    process = NodeProcess(folder, max_concurrent=slots).start()
    try:
        yield process
    finally:
        process.stop()


def executing_node(node: NodeProcess) -> NodeProcess:
    """The node, when this host lets it execute code (root, namespaces, uid switch)."""
    if not node.isolation.get("will_execute"):
        pytest.skip(f"the node refuses to execute here: {node.isolation.get('refusal')}")
    return node


class Tenant:
    """A project with credit, a sandboxes key, and helpers to look at its account."""

    def __init__(self, gateway: GatewayProcess, balance: str = "1.00") -> None:
        self.gateway = gateway
        self.project = gateway.create_project("sandbox-e2e", "--balance", balance)
        self.key = gateway.create_key(self.project, "sandboxes")
        self._reader: str | None = None

    def sandbox(self, runtime: str = "python", *options: str) -> str:
        args = ("--project", self.project, "--runtime", runtime, *options)
        return self.gateway.cli("sandboxes", "create", *args)["id"]

    def account(self) -> tuple[Decimal, Decimal]:
        shown = self.gateway.cli("projects", "show", self.project)
        return Decimal(shown["balance"]), Decimal(shown["reserved"])

    def receipt(self, client: httpx.Client, receipt_id: str) -> dict:
        """GET /v1/receipts/{id} with a receipts-scoped key of the same project."""
        if self._reader is None:
            self._reader = self.gateway.create_key(self.project, "receipts")
        answer = client.get(
            f"{self.gateway.url}/v1/receipts/{receipt_id}",
            headers={"authorization": f"Bearer {self._reader}"},
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def execute(self, client: httpx.Client, **body) -> httpx.Response:
        return client.post(
            f"{self.gateway.url}/v1/sandbox/executions",
            json=body,
            headers={"authorization": f"Bearer {self.key}"},
        )


def expected_cost(duration_ms: int) -> Decimal:
    seconds = Decimal(duration_ms) / 1000
    return PER_EXECUTION + (PER_SECOND * seconds).quantize(Decimal("0.000001"), "ROUND_CEILING")


def slot_processes() -> list[int]:
    """Live host processes running as any slot uid (20000 + slot)."""
    return live_processes(lambda uid: SLOT_UID_BASE <= uid < SLOT_UID_BASE + 64)


def descendants(root: int) -> set[int]:
    """Every process below `root` in the process tree (orphans of a subreaper included)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def node_slot_processes(node_pid: int) -> list[int]:
    """Live processes run by this node's slots: other test runs on the host use the same
    slot uids, so only the node's descendants count."""
    below = descendants(node_pid)
    return [pid for pid in slot_processes() if pid in below]
