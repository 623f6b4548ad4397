"""The deployment recipe of docs/deployment.md, run once: scripts/deploy/haproxy.cfg itself (the
addresses it reads from the environment are this test's ports) in front of two real
instances on one fresh PostgreSQL database. Traffic through the proxy reaches both,
streams pass unbuffered, bodies up to the gateway's own limit pass, and with one
instance stopped the proxy keeps serving through the other, then takes it back when it
returns."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.storage.backends import in_ci, postgres_database
from tests.support.fake_openai import FakeOpenAI
from tests.support.fake_upstream import PAUSE_S
from tests.support.gateway_process import GatewayProcess, free_port
from tests.support.inference import OPENAI_CREDENTIAL, UPSTREAM_ENV

pytestmark = pytest.mark.postgres

RECIPE = Path(__file__).resolve().parents[2] / "scripts" / "deploy" / "haproxy.cfg"
# Two failed checks 2 s apart mark an instance down, two passed ones up again.
CHECKS_S = 10

SLOW_STREAM = """
[providers.fakeai]
kind = "openai"
base_url = "{url}/v1"
api_key_env = "FAKE_OPENAI_KEY"

[models."slow-stream"]
provider = "fakeai"
upstream = "slow-stream"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
"""


def haproxy() -> str:
    found = shutil.which("haproxy", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        reason = "haproxy is not installed (bash scripts/system-deps.sh installs it)"
        if in_ci():
            pytest.fail(f"CI=true and {reason}: the deployment recipe must run in CI")
        pytest.skip(reason)
    return found


class Proxy:
    def __init__(self, binary: str, folder: Path, instances: list[GatewayProcess]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        addresses = {
            f"GATEWAY_{n}": f"127.0.0.1:{gw.port}" for n, gw in enumerate(instances, start=1)
        }
        self.log_path = folder / "haproxy.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [binary, "-db", "-f", str(RECIPE)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "GATEWAY_LISTEN": f"127.0.0.1:{self.port}", **addresses},
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def wait_for(condition: Callable[[], bool], what: str, within_s: float = CHECKS_S) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture(scope="module")
def deployment(postgres_url, tmp_path_factory):
    """(proxy, [instance 1, instance 2], key): the recipe with two instances behind it."""
    binary = haproxy()
    root = tmp_path_factory.mktemp("recipe")
    secrets = root / "secrets"
    secrets.mkdir()
    with ExitStack() as stack:
        url = stack.enter_context(postgres_database())
        upstream = stack.enter_context(FakeOpenAI(OPENAI_CREDENTIAL))
        instances = []
        for name in ("gw1", "gw2"):
            (root / name).mkdir()
            gateway = GatewayProcess(
                root / name,
                storage_url=url,
                secrets_dir=str(secrets),
                extra_config=SLOW_STREAM.format(url=upstream.url),
                env=UPSTREAM_ENV,
            )
            instances.append(stack.enter_context(gateway))
        proxy = Proxy(binary, root, instances)
        stack.callback(proxy.stop)
        exited = proxy.process.poll
        wait_for(lambda: exited() is not None or answers(proxy.url + "/healthz"), "no proxy")
        assert exited() is None, f"haproxy exited:\n{proxy.log()}"
        project = instances[0].create_project("recipe", "--balance", "100")
        yield proxy, instances, instances[1].create_key(project)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def chat(proxy: Proxy, key: str, content: str = "hello", **extra) -> httpx.Response:
    body = {"model": "echo-1", "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(
        proxy.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


def served_by(instances: list[GatewayProcess], request_ids: list[str]) -> list[set[str]]:
    """Per instance, which of these requests its access log shows (a line is written just
    after its response: each id is awaited in one of the logs)."""
    logs: list[str] = []

    def read() -> bool:
        logs[:] = [gw.log() for gw in instances]
        return all(any(rid in log for log in logs) for rid in request_ids)

    wait_for(read, "every request is in an access log", within_s=5)
    return [{rid for rid in request_ids if rid in log} for log in logs]


def test_requests_reach_both_instances_with_their_request_id(deployment):
    proxy, instances, key = deployment
    ids = []
    for _ in range(10):
        response = chat(proxy, key)
        assert response.status_code == 200, response.text
        ids.append(response.headers["x-request-id"])
    first, second = served_by(instances, ids)
    assert first and second, "the proxy must spread requests over both instances"
    assert first.isdisjoint(second) and first | second == set(ids)
    # The proxy's own log line names the same id.
    wait_for(lambda: all(rid in proxy.log() for rid in ids), "the proxy logs the request ids")


def test_a_stream_passes_unbuffered(deployment):
    proxy, _, key = deployment
    body = {"model": "slow-stream", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    arrivals = []
    with httpx.stream(
        "POST",
        proxy.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrivals.append((time.monotonic(), line))
    assert arrivals[-1][1] == "data: [DONE]"
    # The upstream pauses after its first event: a proxy that buffered would deliver
    # everything at the end, at once; one that waits to fill packets (HAProxy without
    # http-no-delay) delivers the first event 200 ms late: a gap of 0.80 s, not 1.0 s.
    assert arrivals[-1][0] - arrivals[0][0] >= 0.9 * PAUSE_S


def test_bodies_up_to_the_gateways_own_limit_pass(deployment):
    proxy, _, key = deployment
    large = chat(proxy, key, content="a" * 1_500_000, max_tokens=4)
    assert large.status_code == 200, large.text[:300]
    too_large = chat(proxy, key, content="a" * 3_000_000, max_tokens=4)
    assert too_large.status_code == 400
    error = too_large.json()["error"]  # the gateway's answer, not the proxy's
    assert error["type"] == "invalid_request"
    assert error["request_id"] == too_large.headers["x-request-id"]


def test_one_instance_stopped_the_other_serves(deployment):
    proxy, (gw1, gw2), key = deployment
    gw1.stop()
    try:
        # At once, before any health check noticed: refused connections are retried on gw2.
        ids = []
        for _ in range(10):
            response = chat(proxy, key)
            assert response.status_code == 200, response.text
            ids.append(response.headers["x-request-id"])
        wait_for(lambda: "gateways/gw1 is DOWN" in proxy.log(), "gw1 marked down")
        response = chat(proxy, key)
        assert response.status_code == 200, response.text
        ids.append(response.headers["x-request-id"])
        assert served_by([gw2], ids) == [set(ids)]  # all of them, or it times out
    finally:
        gw1.start()
    wait_for(lambda: "gateways/gw1 is UP" in proxy.log(), "gw1 back up")
    ids = [chat(proxy, key).headers["x-request-id"] for _ in range(6)]
    assert served_by([gw1, gw2], ids)[0], "the proxy takes the instance back"
