"""Tokens per minute over HTTP, against a real gateway: the echo model (short answers, far
below their output limit) and a fake upstream that keeps requests in flight for a few
seconds, so that what a budget admits is counted before anything is given back. A key's
tpm admits its budget and then 429 with retry-after; what requests did not use comes
back; a project's tpm limits all its keys; both limits hold together; a request above a
whole minute's tokens takes the whole minute; /metrics counts refusals by reason."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ratelimit.token_requests import (
    SLOW,
    assert_rate_limited,
    at_once,
    chat_body,
    estimate,
    post,
    slow_model_config,
)
from tests.support.fake_openai import FakeOpenAI
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import OPENAI_CREDENTIAL, UPSTREAM_ENV

ECHO_BODY, SLOW_BODY = chat_body("echo-1"), chat_body(SLOW)
ECHO, IN_FLIGHT = estimate(ECHO_BODY), estimate(SLOW_BODY)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with FakeOpenAI(OPENAI_CREDENTIAL) as upstream:
        folder = tmp_path_factory.mktemp("tpm")
        config = slow_model_config(upstream.url)
        with GatewayProcess(folder, extra_config=config, env=UPSTREAM_ENV) as process:
            yield process


def project(gateway: GatewayProcess, *options: str) -> str:
    created = gateway.create_project("tpm", *options)
    gateway.cli("credit", "add", "--project", created, "5.00")
    return created


def statuses(responses: list[httpx.Response]) -> list[int]:
    return sorted(r.status_code for r in responses)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_short_answers_give_back_what_they_did_not_use(gateway, stream):
    body = chat_body("echo-1", stream=stream)
    key = gateway.create_key(project(gateway), "inference", "--tpm", str(2 * estimate(body)))
    # Each takes its estimate and gives back all but the few tokens it used: without
    # the give-back the third would be refused.
    answers = [post(gateway.url, key, body) for _ in range(8)]
    assert [r.status_code for r in answers] == [200] * 8
    assert all(("data: [DONE]" in r.text) == stream for r in answers)


def test_a_key_admits_its_budget_then_429_and_what_came_back_passes(gateway):
    key = gateway.create_key(project(gateway), "inference", "--tpm", str(3 * IN_FLIGHT))
    first = asyncio.run(at_once([(gateway.url, key, SLOW_BODY)] * 5))
    assert statuses(first) == [200, 200, 200, 429, 429]
    for refused in (r for r in first if r.status_code == 429):
        assert assert_rate_limited(refused) <= 60
    # Each used 16 of its tokens and gave back the rest: two fit again at once (without
    # the give-back, the bucket would owe almost the whole minute still).
    again = asyncio.run(at_once([(gateway.url, key, SLOW_BODY)] * 2))
    assert statuses(again) == [200, 200]


def test_a_projects_tpm_limits_all_its_keys(gateway):
    shared = project(gateway, "--tpm", str(2 * IN_FLIGHT))
    a, b = gateway.create_key(shared, "inference"), gateway.create_key(shared, "inference")
    responses = asyncio.run(at_once([(gateway.url, k, SLOW_BODY) for k in (a, b, a, b)]))
    assert statuses(responses) == [200, 200, 429, 429]


def test_the_key_and_the_project_limit_together(gateway):
    shared = project(gateway, "--tpm", str(3 * IN_FLIGHT))
    tight = gateway.create_key(shared, "inference", "--tpm", str(2 * IN_FLIGHT))
    other = gateway.create_key(shared, "inference")
    calls = [(gateway.url, k, SLOW_BODY) for k in (tight, tight, tight, other, other)]
    responses = asyncio.run(at_once(calls))
    assert statuses(responses) == [200, 200, 200, 429, 429]  # the project's three
    assert sum(r.status_code == 200 for r in responses[:3]) <= 2  # the key's two at most


def test_a_request_above_a_whole_minute_takes_the_whole_minute(gateway):
    key = gateway.create_key(project(gateway), "inference", "--tpm", str(ECHO // 2))
    assert post(gateway.url, key, ECHO_BODY).status_code == 200  # a full bucket: it passes
    # What it used stays owed until it refills: the next waits for a full bucket again.
    assert 1 <= assert_rate_limited(post(gateway.url, key, ECHO_BODY)) <= 60


def _refusals(gateway: GatewayProcess) -> dict[str, float]:
    text = httpx.get(gateway.url + "/metrics").text
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gateway_rate_limited"
        for sample in family.samples
        if sample.name == "gateway_rate_limited_total"
    }


def test_metrics_count_refusals_by_reason(gateway):
    before = _refusals(gateway)
    by_requests = gateway.create_key(project(gateway), "inference", "--rpm", "1")
    by_tokens = gateway.create_key(project(gateway), "inference", "--tpm", str(ECHO))
    assert post(gateway.url, by_requests, ECHO_BODY).status_code == 200
    assert_rate_limited(post(gateway.url, by_requests, ECHO_BODY))
    assert post(gateway.url, by_tokens, ECHO_BODY).status_code == 200
    for _ in range(2):
        assert_rate_limited(post(gateway.url, by_tokens, ECHO_BODY))
    after = _refusals(gateway)
    assert after.get("rpm", 0) - before.get("rpm", 0) == 1
    assert after.get("tpm", 0) - before.get("tpm", 0) == 2
