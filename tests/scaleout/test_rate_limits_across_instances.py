"""Requests per minute are exact across instances (decisions.md, "Several instances"): two
real gateway processes on one fresh PostgreSQL database, a key of 10 rpm, 30 requests
spread over both at once: exactly 10 pass, the others get 429 with `retry-after`. Once with
the buckets in PostgreSQL (the default there), once in Redis (`[ratelimit] url`). With a
limiter per process, as on SQLite, 20 would pass."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.gateway_process import GatewayProcess

CHAT = {"model": "echo-1", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.postgres
@pytest.mark.parametrize("store", ["postgresql", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_10_rpm_key_lets_exactly_10_through_across_two_instances(
    request, tmp_path, fresh_postgres_url, store
):
    extra = ""
    if store == "redis":
        url, prefix = request.getfixturevalue("redis_url")
        extra = f'\n[ratelimit]\nurl = "{url}"\nprefix = "{prefix}"\n'
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    instances = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        instances.append(
            GatewayProcess(
                tmp_path / name,
                storage_url=fresh_postgres_url,
                secrets_dir=str(secrets_dir),
                extra_config=extra,
            )
        )
    with instances[0] as a, instances[1] as b:
        project = a.create_project("rpm")
        a.cli("credit", "add", "--project", project, "1.00")
        key = b.create_key(project, "inference", "--rpm", "10")
        responses = asyncio.run(_spread([a.url, b.url], key, 30))
        for instance in (a, b):
            assert "shared in " + ("Redis" if store == "redis" else "PostgreSQL") in instance.log()

    passed = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(passed) == 10 and len(refused) == 20, [r.status_code for r in responses]
    for response in refused:
        error = response.json()["error"]
        assert error["type"] == "rate_limit_exceeded"
        assert 1 <= int(response.headers["retry-after"]) <= 60
        assert error["retry_after_seconds"] == int(response.headers["retry-after"])


async def _spread(urls: list[str], key: str, count: int) -> list[httpx.Response]:
    """`count` chat requests at once, alternating between the instances."""
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=30) as client:
        calls = [
            client.post(urls[i % len(urls)] + "/v1/chat/completions", json=CHAT, headers=headers)
            for i in range(count)
        ]
        return await asyncio.gather(*calls)
