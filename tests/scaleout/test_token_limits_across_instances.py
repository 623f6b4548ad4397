"""Tokens per minute are exact across instances (decisions.md, "Token limits"): two real
gateway processes on one fresh PostgreSQL database, a key whose tpm is the estimate of
exactly 10 requests, 30 such requests at once spread over both, held in flight by a slow
upstream: exactly 10 pass, the others get 429 with `retry-after`. Once they settle, what
they did not use is back for both instances. With the buckets in PostgreSQL (the default
there), and in Redis (`[ratelimit] url`)."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import pytest

from tests.ratelimit.token_requests import (
    SLOW,
    assert_rate_limited,
    at_once,
    chat_body,
    estimate,
    slow_model_config,
)
from tests.support.fake_openai import FakeOpenAI
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import OPENAI_CREDENTIAL, UPSTREAM_ENV

BODY = chat_body(SLOW)


@pytest.mark.postgres
@pytest.mark.parametrize("store", ["postgresql", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_budget_for_10_requests_serves_10_whichever_instance_gets_them(
    request, tmp_path, fresh_postgres_url, store
):
    shared = ""
    if store == "redis":
        url, prefix = request.getfixturevalue("redis_url")
        shared = f'\n[ratelimit]\nurl = "{url}"\nprefix = "{prefix}"\n'
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    with ExitStack() as stack:
        upstream = stack.enter_context(FakeOpenAI(OPENAI_CREDENTIAL))
        a, b = (
            stack.enter_context(
                GatewayProcess(
                    _folder(tmp_path, name),
                    storage_url=fresh_postgres_url,
                    secrets_dir=str(secrets_dir),
                    extra_config=shared + slow_model_config(upstream.url),
                    env=UPSTREAM_ENV,
                )
            )
            for name in ("a", "b")
        )
        project = a.create_project("tpm")
        a.cli("credit", "add", "--project", project, "5.00")
        key = b.create_key(project, "inference", "--tpm", str(10 * estimate(BODY)))
        spread = [(gateway.url, key, BODY) for gateway in (a, b)] * 15
        responses = asyncio.run(at_once(spread))
        # Each of the 10 used 16 tokens and gave the rest back, to the one shared bucket:
        # five more fit at once, whichever instance serves them.
        again = asyncio.run(at_once(spread[:5]))

    passed = [r for r in responses if r.status_code == 200]
    assert len(passed) == 10, [r.status_code for r in responses]
    for refused in (r for r in responses if r.status_code != 200):
        assert assert_rate_limited(refused) <= 60
    assert [r.status_code for r in again] == [200] * 5


def _folder(root, name):
    folder = root / name
    folder.mkdir()
    return folder
