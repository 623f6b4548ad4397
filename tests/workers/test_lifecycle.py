"""Stopping two workers: SIGTERM to the parent lets an in-flight stream finish and refuses
new connections meanwhile; and two workers on PostgreSQL keep rpm exact."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import orjson
import pytest

from tests.ratelimit.token_requests import chat_body as token_body
from tests.support.gateway_process import GatewayProcess
from tests.workers.conftest import Workers, workers_gateway
from tests.workers.samples import fire


def test_sigterm_drains_an_in_flight_stream(tmp_path, upstream):
    with workers_gateway(tmp_path, upstream) as gw:
        Workers(gw)  # both serve
        key = gw.create_key(gw.create_project("drain", "--balance", "5"))
        # slow-stream: its first event, a pause of 1 s, then the rest.
        body = {**orjson.loads(token_body("oa/slow-stream")), "stream": True}
        first_event = threading.Event()
        received: list[bytes] = []

        def stream() -> None:
            headers = {"authorization": f"Bearer {key}"}
            with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body,
                              headers=headers, timeout=30) as response:  # fmt: skip
                for piece in response.iter_bytes():
                    received.append(piece)
                    first_event.set()

        client = threading.Thread(target=stream)
        client.start()
        assert first_event.wait(20)
        gw.process.send_signal(signal.SIGTERM)  # the parent alone, as systemd does
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):
            httpx.get(gw.url + "/healthz", timeout=2)  # no new connection meanwhile
        client.join(20)
        assert b"".join(received).rstrip().endswith(b"data: [DONE]")
        assert gw.process.wait(20) == 0
        assert "workers: all stopped" in gw.log()


@pytest.mark.postgres
def test_two_workers_on_postgresql(tmp_path, fresh_postgres_url):
    with GatewayProcess(tmp_path, storage_url=fresh_postgres_url, server_extra="workers = 2") as gw:
        Workers(gw)
        key = gw.create_key(gw.create_project("pg", "--balance", "5"), "inference", "--rpm", "5")
        statuses = sorted(r.status_code for r in fire(gw.url, key, 15))
        assert statuses == [200] * 5 + [429] * 10
