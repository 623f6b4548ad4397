"""Sign-in throttle, idle expiry and the production deployment, each on its own gateway
with small numbers in its `[console]` section."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from tests.console.support import PASSWORD, ConsoleClient, create_user, error_type
from tests.support.gateway_process import CliFailed, GatewayProcess

SMALL = """
[console]
login_failures_per_email = 3
login_failures_per_address = 5
login_window_s = 3
session_idle_s = 2
"""


def _gateway_with_users(folder, config: str):
    with GatewayProcess(folder, extra_config=config) as process:
        for name in ("a", "b"):
            create_user(process, f"{name}@example.com")
        yield process


@pytest.fixture
def small(tmp_path):
    yield from _gateway_with_users(tmp_path, SMALL)


@pytest.fixture
def wide_window(tmp_path):
    """The small counts in a window that no slow (loaded) machine outlasts mid-test."""
    yield from _gateway_with_users(
        tmp_path, SMALL.replace("login_window_s = 3", "login_window_s = 120")
    )


def test_failures_for_one_email_answer_429_until_the_window_passes(small):
    client = ConsoleClient(small)
    for _ in range(3):
        assert client.login("a@example.com", "wrong password!").status_code == 401
    blocked = client.login("a@example.com")  # even the right password waits
    assert blocked.status_code == 429 and error_type(blocked) == "rate_limit_exceeded"
    retry = int(blocked.headers["retry-after"])
    assert 1 <= retry <= 4 and blocked.json()["error"]["retry_after_seconds"] == retry
    assert client.login("b@example.com").status_code == 200  # another email is not blocked
    time.sleep(retry + 0.5)
    assert client.login("a@example.com").status_code == 200


def test_concurrent_guesses_are_counted_as_they_come(wide_window):
    """Guesses sent at once take turns: the count is checked, the password verified and a
    failure recorded before the next guess is checked (the hash takes tens of ms, during
    which every concurrent guess used to pass the check)."""
    clients = [ConsoleClient(wide_window) for _ in range(10)]
    with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
        answers = list(pool.map(lambda c: c.login("a@example.com", "wrong password!"), clients))
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [401] * 3 + [429] * 7
    assert ConsoleClient(wide_window).login("a@example.com").status_code == 429
    for client in clients:
        client.close()


def test_failures_from_one_address_answer_429_for_every_email(wide_window):
    client = ConsoleClient(wide_window)
    for n in range(5):
        assert client.login(f"nobody{n}@example.com", "wrong password!").status_code == 401
    blocked = client.login("b@example.com")
    assert blocked.status_code == 429 and "retry-after" in blocked.headers


def test_an_idle_session_expires(small):
    client = ConsoleClient(small)
    client.login("a@example.com")
    assert client.get("/console/api/me").status_code == 200
    time.sleep(3.2)
    expired = client.get("/console/api/me")
    assert expired.status_code == 401 and error_type(expired) == "unauthenticated"


def test_production_secure_cookie_and_payments_are_the_way_to_fund(tmp_path):
    with GatewayProcess(tmp_path, environment="production") as gateway:
        create_user(gateway, "owner@example.com")
        project = gateway.create_project("prod")
        with pytest.raises(CliFailed) as refused:
            gateway.cli("credit", "add", "--project", project, "5")
        assert refused.value.output["error"]["type"] == "forbidden"
        paid = gateway.cli("payments", "record", "--project", project, "7", "--reference", "T-1")
        assert paid["balance"] == "7.000000" and paid["reference"] == "T-1"
        with pytest.raises(CliFailed) as twice:
            gateway.cli("payments", "record", "--project", project, "7", "--reference", "T-1")
        assert twice.value.code != 0 and twice.value.output["error"]["type"] == "conflict"
        login = httpx.post(
            gateway.url + "/console/api/login",
            json={"email": "owner@example.com", "password": PASSWORD},
        )
        cookie = login.headers["set-cookie"]
        assert "; Secure" in cookie and "HttpOnly" in cookie
        session = {"cookie": cookie.split(";")[0]}
        api = f"{gateway.url}/console/api/projects/{project}/payments"
        paid = httpx.post(api, json={"amount": "3", "reference": "T-2"}, headers=session)
        assert paid.status_code == 201 and paid.json()["balance"] == "10.000000"
        again = httpx.post(api, json={"amount": "3", "reference": "T-1"}, headers=session)
        assert again.status_code == 409
        assert gateway.cli("projects", "show", project)["balance"] == "10.000000"


def test_expired_sessions_and_stale_failures_are_purged_at_sign_in(small):
    import sqlite3

    client = ConsoleClient(small)
    client.login("a@example.com")
    client.login("b@example.com", "wrong password!")
    time.sleep(4.1)  # past the idle expiry (2 s) and the window (3 s), in whole seconds
    ConsoleClient(small).login("b@example.com")
    db = sqlite3.connect(small.folder / "data" / "gateway.db")
    try:
        assert db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1
        assert db.execute("SELECT COUNT(*) FROM login_failures").fetchone()[0] == 0
    finally:
        db.close()
