"""`gateway serve --workers 2` on loopback with a real SQLite file, in front of a fake
OpenAI upstream (its `slow-stream` and `hang-stream` models hold a stream open)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeOpenAI
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import NO_BREAKER, OPENAI_CREDENTIAL, UPSTREAM_ENV, inference_config

# The parent's line once every worker serves (gateway/ops/workers.py).
SERVING = re.compile(r"workers: (\d+) serving \(pids ([\d, ]+)\), run folder (\S+)")


class Workers:
    """The running deployment: the parent's GatewayProcess, its workers and run folder."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.gateway = gateway
        found = wait_for(lambda: SERVING.search(gateway.log()), "the workers' start")
        self.pids = [int(pid) for pid in found.group(2).split(", ")]
        self.run_folder = Path(found.group(3))


def wait_for(probe, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="package")
def upstream():
    with FakeOpenAI(OPENAI_CREDENTIAL) as fake:
        yield fake


def workers_gateway(folder: Path, upstream: FakeOpenAI, extra: str = "") -> GatewayProcess:
    return GatewayProcess(
        folder,
        # lease_s 2: a killed worker's holds are released within about a second.
        extra_config=inference_config(upstream.url, upstream.url)
        + NO_BREAKER
        + "\n[cluster]\nlease_s = 2\n"
        + extra,
        env=UPSTREAM_ENV,
        server_extra="workers = 2",
    )


@pytest.fixture(scope="package")
def workers(tmp_path_factory, upstream):
    with workers_gateway(tmp_path_factory.mktemp("workers"), upstream) as gateway:
        yield Workers(gateway)
