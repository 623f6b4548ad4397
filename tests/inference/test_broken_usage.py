"""Usage an upstream reports that is not a count (negative, fractional, textual, null, a
boolean, absurdly large, or no object at all) is replaced by the gateway's own count: the
client gets its whole answer, showing the usage it is billed, and the receipt (with that
usage) enters the log. Both endpoints, plain and streamed, every provider kind."""

from __future__ import annotations

import time

import httpx
import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens
from tests.metering.billing import books, micros
from tests.support.fake_upstream import BROKEN_USAGE_MODES, REPLY
from tests.support.inference import by_class, sse_payloads

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
PROMPT = "Count these words for me, please."
# What the gateway counts for PROMPT and the fakes' REPLY, and what it costs at the test
# models' prices (0.50 and 1.50 USD per million tokens).
COUNTED = by_class(estimate_tokens(PROMPT), estimate_tokens(REPLY))
# Rounded up once over the classes (decisions.md, "Prices, exactly").
COST = -(-(COUNTED["input_tokens"] * 500_000 + COUNTED["output_tokens"] * 1_500_000) // 10**6)


def body(endpoint: str, model: str, stream: bool) -> dict:
    if endpoint == "chat":
        request = {"model": model, "messages": [{"role": "user", "content": PROMPT}]}
        if stream:
            request["stream_options"] = {"include_usage": True}
    else:
        request = {"model": model, "input": PROMPT}
    return request | {"stream": stream}


def shown_usage(endpoint: str, stream: bool, response) -> dict:
    """The usage the client was shown, under the gateway's names."""
    if not stream:
        usage = response.json()["usage"]
    elif endpoint == "chat":
        payloads = sse_payloads(response.content)
        assert payloads[-1] == "[DONE]", "the stream did not end normally"
        usage = payloads[-2]["usage"]
    else:
        last = sse_payloads(response.content)[-1]
        assert last["type"] == "response.completed", "the stream did not end normally"
        usage = last["response"]["usage"]
    if "prompt_tokens" in usage:
        return {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}
    return {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}


@pytest.fixture(scope="module")
def project(gw) -> str:
    return gw.create_project("broken-usage", "--balance", "100")


@pytest.fixture(scope="module")
def session(gw, project):
    key = gw.create_key(project, "inference,receipts")
    with httpx.Client(
        base_url=gw.url, headers={"authorization": f"Bearer {key}"}, timeout=20
    ) as client:
        yield client


@pytest.mark.parametrize("mode", BROKEN_USAGE_MODES)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "oa-chat", "an"])
def test_broken_usage_is_replaced_by_the_gateways_count(
    gw, project, session, provider, endpoint, stream, mode
):
    before = books(gw, project)
    response = session.post(PATHS[endpoint], json=body(endpoint, f"{provider}/{mode}", stream))
    assert response.status_code == 200, response.text
    assert by_class(**shown_usage(endpoint, stream, response)) == COUNTED
    receipt = session.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "succeeded"
    assert receipt["usage"] == COUNTED
    assert receipt["usage_source"] == "gateway"
    assert micros(receipt["cost"]) == COST
    after = books(gw, project)
    assert after["balance"] == before["balance"] - COST and after["reserved"] == 0


@pytest.mark.parametrize("mode", BROKEN_USAGE_MODES)
def test_receipts_of_broken_usage_enter_the_log(session, mode):
    receipts = [
        session.post(PATHS["chat"], json=body("chat", f"an/{mode}", stream)).headers["x-receipt-id"]
        for stream in (False, True)
    ]
    deadline = time.monotonic() + 10
    for receipt_id in receipts:
        while (proof := session.get(f"/api/proofs/{receipt_id}")).status_code == 202:
            assert time.monotonic() < deadline, "the receipt never entered the log"
            time.sleep(0.05)
        assert proof.status_code == 200
        public = proof.json()["receipt"]
        assert public["usage"] == COUNTED and public["usage_source"] == "gateway"
