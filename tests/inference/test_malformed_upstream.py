"""An upstream answer whose fields the gateway reads come in the wrong type (a message
that is a string, an output item that is no object, a stream delta that is no object)
is the upstream's failure: 502 provider_error before the stream opened, one in-band
provider_error after; never a 500 or an internal_error. Nothing was delivered, so
nothing is billed."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.metering.billing import books
from tests.support.errors import assert_error
from tests.support.fake_upstream import MALFORMED, SECRET
from tests.support.inference import sse_payloads

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


def body(endpoint: str, model: str, stream: bool) -> dict:
    if endpoint == "chat":
        return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    return {"model": model, "stream": stream, "input": "hi"}


@pytest.fixture(scope="module")
def project(gw) -> str:
    return gw.create_project("malformed-upstream", "--balance", "1")


@pytest.fixture(scope="module")
def session(gw, project):
    key = gw.create_key(project, "inference,receipts")
    with httpx.Client(
        base_url=gw.url, headers={"authorization": f"Bearer {key}"}, timeout=20
    ) as client:
        yield client


def unchanged_books(gw, project: str, before: dict) -> dict:
    """The books once the hold is released (on the reservation stage's way out, after the
    response left)."""
    deadline = time.monotonic() + 3
    while (found := books(gw, project)) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "oa-chat", "an"])
def test_an_answer_the_gateway_cannot_read_is_a_provider_error(
    gw, project, session, provider, endpoint, stream
):
    before = books(gw, project)
    response = session.post(PATHS[endpoint], json=body(endpoint, f"{provider}/{MALFORMED}", stream))
    assert b"internal_error" not in response.content and SECRET not in response.text
    if not stream:
        assert_error(response, 502, "provider_error")
    else:
        assert response.status_code == 200  # the first events were fine: in band
        errors = [p for p in sse_payloads(response.content) if isinstance(p, dict) and "error" in p]
        assert [e["error"]["type"] for e in errors] == ["provider_error"]
    assert unchanged_books(gw, project, before) == before
