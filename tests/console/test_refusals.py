"""402s that explain themselves (issue 12, item 7): which limit refused the hold and what
was left, on /v1 with a key and in the key-less playground, over real HTTP."""

from __future__ import annotations

import httpx

from tests.console.support import error_type
from tests.support.http import bearer, chat_body


def _chat(gateway, key: str, **extra) -> httpx.Response:
    return httpx.post(
        gateway.url + "/v1/chat/completions", json=chat_body(**extra), headers=bearer(key)
    )


def test_a_small_balance_says_the_hold_covers_the_whole_output(gateway):
    project = gateway.create_project("small", "--balance", "0.005")
    key = gateway.create_key(project, "inference")
    refused = _chat(gateway, key)
    assert refused.status_code == 402 and error_type(refused) == "insufficient_balance"
    message = refused.json()["error"]["message"]
    assert "available balance is 0.005000 USD" in message
    # echo-1's 4096 output tokens, their tolerance included (pricing.held_output_tokens)
    assert "max_tokens" in message and "needs a hold of 0.007" in message
    assert _chat(gateway, key, max_tokens=16).status_code == 200  # a smaller hold fits


def test_the_keys_monthly_limit_is_named(gateway):
    project = gateway.create_project("limited", "--balance", "5")
    key = gateway.create_key(project, "inference", "--monthly-limit", "0.001")
    refused = _chat(gateway, key)
    assert refused.status_code == 402 and error_type(refused) == "budget_exceeded"
    message = refused.json()["error"]["message"]
    assert "key's monthly limit of 0.001000 USD has 0.001000 USD left" in message


def test_the_projects_monthly_budget_is_named(gateway):
    project = gateway.create_project("budgeted", "--balance", "5", "--budget", "0.002")
    key = gateway.create_key(project, "inference")
    refused = _chat(gateway, key)
    assert refused.status_code == 402 and error_type(refused) == "budget_exceeded"
    assert "project's monthly budget of 0.002000 USD" in refused.json()["error"]["message"]


def test_the_playground_explains_too(owner):
    project = owner.post("/console/api/projects", {"name": "unfunded"}).json()["id"]
    refused = owner.post(
        f"/console/api/projects/{project}/playground/chat/completions", chat_body()
    )
    assert refused.status_code == 402
    assert "available balance is 0.000000 USD" in refused.json()["error"]["message"]
