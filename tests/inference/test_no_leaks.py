"""Upstream credentials and upstream error bodies never reach a client or a log line."""

from __future__ import annotations

import httpx

from tests.support.fake_upstream import SECRET
from tests.support.inference import ANTHROPIC_CREDENTIAL, OPENAI_CREDENTIAL

SECRETS = [SECRET, OPENAI_CREDENTIAL, ANTHROPIC_CREDENTIAL]
FAULTS = ["fault-400", "fault-500", "fail-before-first-byte", "cut-mid-stream", "normal"]


def _exchanges(session: httpx.Client, models: list[str]) -> list[httpx.Response]:
    responses = []
    for model in models:
        for stream in (False, True):
            chat = {
                "model": model,
                "stream": stream,
                "messages": [{"role": "user", "content": "x"}],
            }
            responses.append(session.post("/v1/chat/completions", json=chat))
            answer = {"model": model, "stream": stream, "input": "x"}
            responses.append(session.post("/v1/responses", json=answer))
    return responses


def test_no_secret_in_any_response_or_log_line(gw, http, impatient_gw, impatient_http):
    models = [f"{p}/{fault}" for p in ("oa", "oa-chat", "an") for fault in FAULTS]
    responses = _exchanges(http, [*models, "dead/normal"])
    responses += _exchanges(impatient_http, ["oa/slow", "an/slow", "oa/hang-stream"])
    statuses = {r.status_code for r in responses}
    assert {200, 400, 502, 504} <= statuses  # every kind of failure was provoked
    for response in responses:
        wire = response.content.decode() + str(response.headers)
        for secret in SECRETS:
            assert secret not in wire, (secret, response.request.url, response.status_code)
    # The failures were logged...
    assert "provider fakeai failed: server error (HTTP 500) request_id=req_" in gw.log()
    assert "provider fakeanthropic failed: request rejected as invalid (400)" in gw.log()
    assert "provider fakeanthropic failed: timed out (504)" in impatient_gw.log()
    for process in (gw, impatient_gw):
        for line in process.log().splitlines():
            for secret in SECRETS:
                assert secret not in line, line  # ...without what must stay upstream


def test_credentials_never_follow_a_redirect(http, fake_openai, fake_anthropic):
    for model in ("oa/redirect", "an/redirect"):
        for stream in (False, True):
            chat = {
                "model": model,
                "stream": stream,
                "messages": [{"role": "user", "content": "x"}],
            }
            response = http.post("/v1/chat/completions", json=chat)
            assert response.status_code == 502, response.text
            assert response.json()["error"]["type"] == "provider_error"
    assert fake_openai.sent(model="redirect")  # the first hop was made...
    assert fake_anthropic.sent(model="redirect")
    stolen = [
        r for fake in (fake_openai, fake_anthropic) for r in fake.requests if r.path == "/stolen"
    ]
    assert stolen == []  # ...and never the second
