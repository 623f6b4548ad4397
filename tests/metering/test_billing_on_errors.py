"""The spec's "Billing on errors", rule by rule, through a real gateway and upstream."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.metering.billing import books, chat

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


def body(endpoint: str, model: str, **extra) -> dict:
    if endpoint == "chat":
        return chat(model, "bill me", **extra)
    return {"model": model, "input": "bill me", **extra}


@pytest.fixture
def account(gw):
    project = gw.create_project("billing", "--balance", "5")
    key = gw.create_key(project, "inference,receipts", "--rpm", "1000")
    return project, key


def post(gw, key, path, payload, **kwargs) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(gw.url + path, json=payload, headers=headers, **{"timeout": 30, **kwargs})


def test_errors_before_execution_are_never_billed(gw, account):
    project, key = account
    before = books(gw, project)
    narrow = gw.create_key(project, "receipts")
    refusals = [
        post(gw, "proj_live_" + "x" * 32, PATHS["chat"], chat()),  # unknown key
        post(gw, narrow, PATHS["chat"], chat()),  # scope
        post(gw, key, PATHS["chat"], {"model": "echo-1"}),  # validation
        post(gw, key, PATHS["chat"], chat("no-such-model")),  # policy
        post(gw, key, PATHS["chat"], chat(max_tokens=10**9, model="echo-1")),  # passes: capped
    ]
    statuses = [r.status_code for r in refusals]
    assert statuses[:4] == [401, 403, 400, 404]
    poor = gw.create_project("poor", "--balance", "0.000001")
    poor_key = gw.create_key(poor, "inference")
    assert post(gw, poor_key, PATHS["chat"], chat()).status_code == 402
    assert books(gw, poor)["balance"] == 1 and books(gw, poor)["reserved"] == 0
    limited = gw.create_key(project, "inference", "--rpm", "1")
    assert post(gw, limited, PATHS["chat"], chat()).status_code == 200
    assert post(gw, limited, PATHS["chat"], chat()).status_code == 429
    after = books(gw, project)
    # Only the two requests that ran were charged.
    charged = before["balance"] - after["balance"]
    assert after["month_spend"] == charged > 0 and after["reserved"] == 0
    assert all("x-receipt-id" not in r.headers for r in refusals[:4])


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("model", "status"),
    [
        ("oa/fault-400", 400),
        ("oa/fault-500", 502),
        ("oa/fail-before-first-byte", 502),
        ("oa/slow", 504),
        ("dead/normal", 502),
    ],
)
def test_upstream_failures_release_in_full(gw, account, endpoint, stream, model, status):
    project, key = account
    before = books(gw, project)
    response = post(gw, key, PATHS[endpoint], body(endpoint, model, stream=stream))
    assert response.status_code == status
    assert "x-receipt-id" not in response.headers
    assert settled_books(gw, project, before) == before


def settled_books(gw, project: str, expected: dict) -> dict:
    """The books once the hold is closed: the reservation stage releases it on its way out,
    after the error response left, so a client can read the books a moment before."""
    deadline = time.monotonic() + 3
    while (found := books(gw, project)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
def test_a_stream_cut_after_output_bills_what_was_delivered(gw, account, endpoint):
    project, key = account
    before = books(gw, project)
    response = post(gw, key, PATHS[endpoint], body(endpoint, "oa/cut-mid-stream", stream=True))
    assert response.status_code == 200
    receipt = httpx.get(
        f"{gw.url}/v1/receipts/{response.headers['x-receipt-id']}",
        headers={"authorization": f"Bearer {key}"},
    ).json()
    assert receipt["status"] == "failed"
    assert receipt["usage"]["output_tokens"] > 0
    cost = int(float(receipt["cost"]) * 1_000_000 + 0.5)
    after = books(gw, project)
    assert after["balance"] == before["balance"] - cost and cost > 0
    assert after["reserved"] == 0


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_client_that_leaves_before_the_upstream_accepted_pays_nothing(
    gw, account, upstream, endpoint, stream
):
    """`slow` answers nothing, not even its status, for 3 s: a client that leaves in the
    meantime cancels a request the upstream never accepted. (After the upstream accepted,
    the prompt is billed: tests/inference/test_cancel.py.)"""
    project, key = account
    before = books(gw, project)
    upstream.disconnected.pop("slow", None)
    with pytest.raises(httpx.ReadTimeout):
        post(gw, key, PATHS[endpoint], body(endpoint, "oa/slow", stream=stream), timeout=0.3)
    gone = time.monotonic()
    deadline = gone + 3
    while "slow" not in upstream.disconnected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "slow" in upstream.disconnected, "the upstream call outlived the client"
    assert upstream.disconnected["slow"] - gone < 0.5
    assert settled_books(gw, project, before) == before
