"""kill -9 with requests in flight: after a restart nothing is reserved and the books add up."""

from __future__ import annotations

import threading
import time

import httpx

from tests.metering.billing import books, chat
from tests.metering.conftest import metered_gateway


def test_holds_of_a_killed_gateway_are_released_at_restart(tmp_path, upstream):
    gw = metered_gateway(tmp_path, upstream, timeout_s=30).start()
    try:
        project = gw.create_project("crash", "--balance", "5")
        key = gw.create_key(project, "inference,receipts")
        before = books(gw, project)

        def slow_request() -> None:
            try:  # `slow` answers after 3 s: the gateway dies first
                httpx.post(
                    gw.url + "/v1/chat/completions",
                    json=chat("oa/slow"),
                    headers={"authorization": f"Bearer {key}"},
                    timeout=10,
                )
            except httpx.HTTPError:
                pass

        clients = [threading.Thread(target=slow_request) for _ in range(5)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 5
        while books(gw, project)["reserved"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # let every request take its hold
        in_flight = books(gw, project)
        assert in_flight["reserved"] > 0

        gw.kill()
        for client in clients:
            client.join()
        assert books(gw, project)["reserved"] == in_flight["reserved"]  # the dead keep holding

        gw.start()
        after = books(gw, project)
        assert after == {**before, "reserved": 0}  # released, and nothing charged
        served = httpx.post(
            gw.url + "/v1/chat/completions",
            json=chat("oa/normal"),
            headers={"authorization": f"Bearer {key}"},
        )
        assert served.status_code == 200
        final = books(gw, project)
        assert final["reserved"] == 0
        assert final["balance"] == before["balance"] - final["month_spend"] < before["balance"]
    finally:
        gw.stop()
