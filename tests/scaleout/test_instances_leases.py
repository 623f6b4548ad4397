"""Leases across two real instances: a killed instance's hold is released by the survivor
within about one lease; an instance that cannot renew its lease serves nothing (503)
until it renews."""

from __future__ import annotations

import threading
import time

import asyncpg
import httpx
import pytest

from tests.scaleout.instances import LEASE_S, books, chat, instance, owner_of
from tests.support.fake_openai import FakeOpenAI
from tests.support.inference import NO_BREAKER, OPENAI_CREDENTIAL, UPSTREAM_ENV, inference_config

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def upstream():
    with FakeOpenAI(OPENAI_CREDENTIAL) as fake:
        yield fake


@pytest.fixture
def pair(tmp_path, fresh_postgres_url, upstream):
    secrets = str(tmp_path / "secrets")
    extra = inference_config(upstream.url, upstream.url) + NO_BREAKER
    made = [
        instance(tmp_path / name, fresh_postgres_url, secrets, extra, env=UPSTREAM_ENV)
        for name in ("a", "b")
    ]
    try:
        yield made[0].start(), made[1].start()
    finally:
        for gw in made:
            gw.stop()


def test_a_killed_instances_hold_is_released_by_the_survivor(pair, fresh_postgres_url):
    a, b = pair
    project = a.create_project("crash", "--balance", "5")
    key = a.create_key(project)
    before = books(fresh_postgres_url, project)
    first_chunk = threading.Event()

    def stream_on_b() -> None:
        body = {
            "model": "oa/hang-stream",  # two text events, then the upstream hangs
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
        headers = {"authorization": f"Bearer {key}"}
        try:
            with httpx.stream(
                "POST", b.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
            ) as response:
                for _ in response.iter_raw():
                    first_chunk.set()
        except httpx.HTTPError:
            pass  # b dies under it

    client = threading.Thread(target=stream_on_b)
    client.start()
    assert first_chunk.wait(10)
    held = books(fresh_postgres_url, project)
    assert held["reserved"] > 0 and held["balance"] == before["balance"]

    b.kill()
    killed = time.monotonic()
    client.join()
    while books(fresh_postgres_url, project)["reserved"] and time.monotonic() - killed < 10:
        time.sleep(0.05)
    released_after = time.monotonic() - killed

    assert books(fresh_postgres_url, project) == before  # nothing held, nothing charged
    assert released_after < LEASE_S + 1, released_after
    served = chat(a, key)  # the survivor serves the project on, and charges it exactly
    assert served.status_code == 200
    after = books(fresh_postgres_url, project)
    assert after["reserved"] == 0 and after["balance"] < before["balance"]


async def test_an_instance_that_cannot_renew_its_lease_answers_503_until_it_does(
    pair, fresh_postgres_url
):
    a, b = pair
    key = a.create_key(a.create_project("fenced", "--balance", "5"))
    assert chat(b, key).status_code == 200
    # Lock b's registry row: its renewals wait (as on a database it cannot reach).
    blocker = await asyncpg.connect(fresh_postgres_url)
    try:
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute("SELECT 1 FROM instances WHERE id = $1 FOR UPDATE", owner_of(b))
        deadline = time.monotonic() + LEASE_S * 2
        while (fenced := chat(b, key)).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fenced.status_code == 503, fenced.text
        assert fenced.json()["error"]["type"] == "service_unavailable"
        assert int(fenced.headers["retry-after"]) >= 1
        assert chat(a, key).status_code == 200  # the other instance serves on
        # Its health check fails too, so a load balancer sends the traffic to the other.
        assert httpx.get(b.url + "/healthz").status_code == 503
        assert httpx.get(a.url + "/healthz").status_code == 200
        time.sleep(LEASE_S / 2)
        assert chat(b, key).status_code == 503  # for as long as it cannot renew
        await transaction.rollback()
    finally:
        await blocker.close()
    deadline = time.monotonic() + LEASE_S * 2
    while (back := chat(b, key)).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert back.status_code == 200, back.text
