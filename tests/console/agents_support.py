"""A console-serving `gateway serve` wired to a real `gateway sandbox-node`, and the
agents API calls the agents tests share."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import orjson
import pytest

from tests.console.support import ConsoleClient, create_user
from tests.sandbox_e2e.helpers import NodeProcess, sandbox_config
from tests.support.gateway_process import GatewayProcess

SIX_TIMES_SEVEN = "Compute this:\n```python\nprint(6*7)\n```\n"
SLOW = "```python\nimport time\ntime.sleep(10)\n```"


@contextlib.contextmanager
def gateway_with_node(folder: Path):
    """The gateway and its node; skips where the node may not execute code."""
    (folder / "node-home").mkdir()
    node = NodeProcess(folder / "node-home", max_concurrent=2)
    node.start()
    try:
        if not node.isolation.get("will_execute"):
            pytest.skip(f"the node refuses to execute here: {node.isolation.get('refusal')}")
        extra = sandbox_config(node.url, node.secret_file, max_concurrent=2)
        (folder / "gateway-home").mkdir()
        with GatewayProcess(folder / "gateway-home", extra_config=extra) as gateway:
            create_user(gateway, "owner@example.com")
            yield gateway
    finally:
        node.stop()


def tool_agent(client: ConsoleClient, project_id: str, timeout_s: int = 10) -> dict:
    """A new agent with the sandbox tool on a new python sandbox of the project."""
    sandbox = client.post(
        f"/console/api/projects/{project_id}/sandboxes",
        {"runtime": "python", "timeout_s": timeout_s},
    )
    assert sandbox.status_code == 201, sandbox.text
    created = client.post(
        f"/console/api/projects/{project_id}/agents",
        {
            "name": "calculator",
            "model": "echo-1",
            "tools": ["sandbox"],
            "sandbox_id": sandbox.json()["id"],
        },
    )
    assert created.status_code == 201, created.text
    return created.json()


def start_run(client: ConsoleClient, agent_id: str, text: str, budget: str) -> dict:
    started = client.post(f"/console/api/agents/{agent_id}/runs", {"input": text, "budget": budget})
    assert started.status_code == 201, started.text
    return started.json()


def events(client: ConsoleClient, agent_id: str, run_id: str, *, until: str = "end"):
    """(event, data) pairs of the run's SSE stream, up to the first `until` event."""
    path = f"/console/api/agents/{agent_id}/runs/{run_id}/events"
    with client.http.stream("GET", path, timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        name = "message"
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                yield name, orjson.loads(line[len("data: ") :])
                if name == until:
                    return
                name = "message"


def wait_run(client: ConsoleClient, agent_id: str, run_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = client.get(f"/console/api/agents/{agent_id}/runs/{run_id}").json()
        if run["status"] != "running" or time.monotonic() > deadline:
            return run
        time.sleep(0.1)
