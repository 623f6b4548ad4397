"""Two workers serve as one gateway: requests land on both, `/metrics` counts them all
whichever worker answers, rpm and tpm hold exactly across them on SQLite (no Redis), a
revocation is seen by both at the next request, and a worker killed mid-stream is replaced
while its hold is released."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import httpx
import orjson

from tests.metering.billing import books
from tests.ratelimit.token_requests import assert_rate_limited, at_once, estimate
from tests.ratelimit.token_requests import chat_body as token_body
from tests.workers.conftest import wait_for
from tests.workers.samples import fire, requests_counted, scraped, worker_samples


def test_requests_land_on_both_workers_and_metrics_count_them_all(workers):
    gw = workers.gateway
    key = gw.create_key(gw.create_project("spread", "--balance", "5"))
    before_each = {n: requests_counted(s) for n, s in worker_samples(workers.run_folder).items()}
    before = scraped(gw.url)

    assert [r.status_code for r in fire(gw.url, key, 40)] == [200] * 40

    after_each = {n: requests_counted(s) for n, s in worker_samples(workers.run_folder).items()}
    served = {n: after_each[n] - before_each.get(n, 0) for n in after_each}
    assert len(served) == 2 and all(count > 0 for count in served.values()), served
    assert sum(served.values()) == 40
    # Whichever worker answers the scrape, it counts both: exactly, at once.
    for _ in range(4):
        assert scraped(gw.url) - before == 40


def test_the_summary_is_printed_once(workers):
    log = workers.gateway.log()
    assert log.count("listening on http://127.0.0.1:") == 1
    assert log.count("model echo-1 via local: ready") == 1
    assert log.count("workers: 2 serving") == 1


def test_rpm_is_exact_across_workers(workers):
    gw = workers.gateway
    key = gw.create_key(gw.create_project("rpm", "--balance", "5"), "inference", "--rpm", "10")
    statuses = sorted(r.status_code for r in fire(gw.url, key, 30))
    assert statuses == [200] * 10 + [429] * 20


def test_tpm_is_exact_across_workers(workers):
    """Ten requests' tokens; thirty at once to a model that answers after 3 s (none gives
    back before all were judged): exactly ten pass."""
    gw = workers.gateway
    body = token_body("oa/slow")
    tpm = str(10 * estimate(body))
    key = gw.create_key(gw.create_project("tpm", "--balance", "5"), "inference", "--tpm", tpm)
    responses = asyncio.run(at_once([(gw.url, key, body)] * 30))
    assert sum(r.status_code == 200 for r in responses) == 10
    for refused in (r for r in responses if r.status_code != 200):
        assert_rate_limited(refused)


def test_a_revocation_is_seen_by_every_worker_at_the_next_request(workers):
    gw = workers.gateway
    key = gw.create_key(gw.create_project("revoke", "--balance", "5"))
    assert {r.status_code for r in fire(gw.url, key, 20)} == {200}  # cached by both
    gw.cli("keys", "revoke", key)
    assert {r.status_code for r in fire(gw.url, key, 20)} == {401}


def _serving_pid(workers) -> int:
    """The worker whose own samples show an open hold."""
    for name, samples in worker_samples(workers.run_folder).items():
        if dict((tuple(k), v) for k, v in samples["gateway_open_holds"])[()] > 0:
            index = int(name.split("-")[1].split(".")[0])
            return workers.pids[index]
    return 0


def test_a_worker_killed_mid_stream_is_replaced_and_its_hold_released(workers):
    """Last in this file: the other tests' workers are the first two."""
    gw = workers.gateway
    project = gw.create_project("killed", "--balance", "5")
    key = gw.create_key(project)
    body = {**orjson.loads(token_body("oa/hang-stream")), "stream": True}
    first_event = threading.Event()
    ended: list[BaseException | None] = []

    def stream() -> None:
        headers = {"authorization": f"Bearer {key}"}
        try:
            with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body,
                              headers=headers, timeout=60) as response:  # fmt: skip
                for _ in response.iter_bytes():
                    first_event.set()
            ended.append(None)
        except httpx.HTTPError as exc:
            ended.append(exc)

    client = threading.Thread(target=stream)
    client.start()
    assert first_event.wait(20)
    assert books(gw, project)["reserved"] > 0
    victim = wait_for(lambda: _serving_pid(workers), "the stream's worker")
    os.kill(victim, signal.SIGKILL)
    client.join(20)
    assert ended and ended[0] is not None  # the stream was cut, not finished

    wait_for(lambda: books(gw, project)["reserved"] == 0, "the killed worker's hold released")
    wait_for(lambda: f"(pid {victim}) exited with signal SIGKILL" in gw.log(), "the restart")
    index = workers.pids.index(victim)
    wait_for(lambda: gw.log().count(f"worker {index} (pid ") >= 2, "the replacement")
    assert books(gw, project)["month_spend"] == 0  # the cut stream is not billed
    assert {r.status_code for r in fire(gw.url, key, 10)} == {200}
