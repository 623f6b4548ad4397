"""Chat requests whose token estimate the tests know to the token, and a fake upstream that
keeps them in flight: what tokens-per-minute tests send to real gateways."""

from __future__ import annotations

import asyncio

import httpx
import orjson

from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS

SLOW = "slow-model"  # a model of the fake upstream that answers after SLOW_S
USED = INPUT_TOKENS + OUTPUT_TOKENS  # what the fake bills each request
MAX_TOKENS = 100


def slow_model_config(upstream_url: str) -> str:
    """A provider at the fake OpenAI upstream and SLOW, its model in "slow" mode."""
    return f"""
[providers.fakeai]
kind = "openai"
base_url = "{upstream_url}/v1"
api_key_env = "FAKE_OPENAI_KEY"

[models."{SLOW}"]
provider = "fakeai"
upstream = "slow"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
max_output_tokens = 4096
"""


def chat_body(model: str, max_tokens: int = MAX_TOKENS, *, stream: bool = False) -> bytes:
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": "How many tokens is this?"}],
    }
    return orjson.dumps(body)


def estimate(body: bytes, max_tokens: int = MAX_TOKENS) -> int:
    """What the gateway takes for `body`: its bytes / 4, rounded up, and its output limit."""
    return -(-len(body) // 4) + max_tokens


def post(url: str, key: str, body: bytes) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", content=body, headers=_headers(key), timeout=30)


async def at_once(calls: list[tuple[str, str, bytes]]) -> list[httpx.Response]:
    """(gateway url, key, body) requests sent together."""
    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(
            *(
                client.post(url + "/v1/chat/completions", content=body, headers=_headers(key))
                for url, key, body in calls
            )
        )


def _headers(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "content-type": "application/json"}


def assert_rate_limited(response: httpx.Response) -> int:
    """A 429 rate_limit_exceeded with retry-after; its seconds."""
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["type"] == "rate_limit_exceeded"
    seconds = int(response.headers["retry-after"])
    assert error["retry_after_seconds"] == seconds >= 1
    return seconds
