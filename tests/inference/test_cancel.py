"""A client that hangs up after the upstream accepted its request (answered 200) owes the
prompt the upstream read, and whatever output it was sent: a receipt with status
`cancelled`. Real sockets against a real gateway; the upstream accepts, sends its first
event (or only its headers), then stalls until the gateway hangs up too.

(A client that leaves before the upstream accepted pays nothing: see
tests/metering/test_billing_on_errors.py.)
"""

from __future__ import annotations

import contextlib
import sqlite3
import time

import httpx
import orjson
import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens
from model_gateway.gateway.metering.class_prices import split_usage
from model_gateway.gateway.metering.money import cost_of_tokens
from tests.metering.billing import books, micros
from tests.support.inference import by_class

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
PROMPT = "Read all of this, then I will hang up on you."
MODE = "stall-after-accept"  # streams: the first event, then nothing; plain: headers only
SILENT_STREAM = "stall-before-first"  # a stream's 200 and headers, then nothing
# The prompt, at the test models' input price (0.50 USD per million tokens); no output.
BILLED = by_class(estimate_tokens(PROMPT), 0)
COST = cost_of_tokens(BILLED["input_tokens"], 500_000)


def body(endpoint: str, provider: str, stream: bool, mode: str = MODE) -> dict:
    model = f"{provider}/{mode}"
    if endpoint == "chat":
        return {"model": model, "stream": stream, "messages": [{"role": "user", "content": PROMPT}]}
    return {"model": model, "stream": stream, "input": PROMPT}


@pytest.fixture
def account(gw):
    project = gw.create_project("cancel", "--balance", "1")
    return project, {"authorization": f"Bearer {gw.create_key(project, 'inference,receipts')}"}


@pytest.fixture
def upstream(fake_openai, fake_anthropic, request):
    """The fake behind the test's provider, its last hang-ups forgotten."""
    fake = fake_anthropic if request.node.callspec.params["provider"] == "an" else fake_openai
    for mode in (MODE, SILENT_STREAM):
        fake.disconnected.pop(mode, None)
    return fake


def wait_for(condition, what: str, timeout_s: float = 5):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return value


def receipts_in_storage(gw, project_id: str) -> list[dict]:
    """The project's receipts, read from the gateway's database (a client that hung up
    before the headers never saw the receipt's id)."""
    uri = f"file:{gw.folder / 'data' / 'gateway.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        rows = db.execute(
            "SELECT id, status, usage, usage_source, cost FROM receipts WHERE project_id = ?",
            (project_id,),
        ).fetchall()
    return [
        {"id": id_, "status": status, "usage": orjson.loads(usage), "usage_source": source}
        | {"cost": cost}
        for id_, status, usage, source, cost in rows
    ]


def access_status(gw, receipt_id: str) -> int:
    """The status of the request's access line (text format: `req_… METHOD PATH STATUS …`),
    once the log has flushed it."""
    line = wait_for(
        lambda: next((ln for ln in gw.log().splitlines() if f"receipt={receipt_id}" in ln), None),
        "no access line for the request",
    )
    return int(line.split()[line.split().index("POST") + 2])


def assert_billed_the_prompt(gw, project: str, before: dict, receipt: dict, cost: int) -> None:
    assert receipt["status"] == "cancelled"
    counts, _ = split_usage(receipt["usage"])  # a stored record's usage holds the prices too
    assert counts == BILLED
    assert receipt["usage_source"] == "gateway"  # the upstream never reported its count
    assert cost == COST > 0
    after = books(gw, project)
    assert after["balance"] == before["balance"] - COST
    assert after["month_spend"] == before["month_spend"] + COST
    assert after["reserved"] == 0


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "oa-chat", "an"])
def test_a_stream_cut_after_its_first_event_bills_the_prompt(
    gw, account, upstream, provider, endpoint
):
    project, headers = account
    before = books(gw, project)
    with (
        httpx.Client(base_url=gw.url, headers=headers, timeout=20) as session,
        session.stream("POST", PATHS[endpoint], json=body(endpoint, provider, True)) as response,
    ):
        assert response.status_code == 200
        receipt_id = response.headers["x-receipt-id"]
        first = next(response.iter_raw())  # role only, or response.created: no output
        assert b"Hello" not in first
    wait_for(lambda: MODE in upstream.disconnected, "the upstream call outlived the client")
    [receipt] = wait_for(lambda: receipts_in_storage(gw, project), "no receipt for the cancel")
    assert receipt["id"] == receipt_id
    receipt = httpx.get(f"{gw.url}/v1/receipts/{receipt_id}", headers=headers).json()
    assert_billed_the_prompt(gw, project, before, receipt, micros(receipt["cost"]))
    assert access_status(gw, receipt_id) == 499  # the client closed the request: not a 500


@pytest.mark.parametrize(
    ("stream", "mode"), [(False, MODE), (True, SILENT_STREAM)], ids=["plain", "stream"]
)
@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "oa-chat", "an"])
def test_a_client_left_after_the_upstream_accepted_but_before_any_answer_owes_the_prompt(
    gw, account, upstream, provider, endpoint, stream, mode
):
    """The upstream sent 200 and its headers, and nothing more: the gateway has not
    answered yet (a stream opens at the upstream's first event) when the client leaves."""
    project, headers = account
    before = books(gw, project)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            gw.url + PATHS[endpoint],
            json=body(endpoint, provider, stream, mode),
            headers=headers,
            timeout=httpx.Timeout(20, read=0.5),
        )
    wait_for(lambda: mode in upstream.disconnected, "the upstream call outlived the client")
    [receipt] = wait_for(lambda: receipts_in_storage(gw, project), "no receipt for the cancel")
    assert_billed_the_prompt(gw, project, before, receipt, receipt["cost"])
    assert access_status(gw, receipt["id"]) == 499  # the client closed the request: not a 500
