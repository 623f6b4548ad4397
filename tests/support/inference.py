"""Shared by the inference tests: upstream credentials, the gateway configuration that
puts every provider kind in front of the fakes, and a plain SSE reader for raw checks."""

from __future__ import annotations

import itertools

import orjson

from tests.support.gateway_process import free_port

OPENAI_CREDENTIAL = "sk-fake-openai-credential-3b9f01"
ANTHROPIC_CREDENTIAL = "sk-ant-fake-credential-8c2e77"
UPSTREAM_ENV = {"FAKE_OPENAI_KEY": OPENAI_CREDENTIAL, "FAKE_ANTHROPIC_KEY": ANTHROPIC_CREDENTIAL}
IMPATIENT_TIMEOUT_S = 0.5

MODES = [
    "normal",
    "fault-400",
    "fault-500",
    "fail-before-first-byte",
    "slow",
    "cut-mid-stream",
    "slow-stream",
    "hang-stream",
    "no-usage",
    "tool-call",
    "length",
    "redirect",
]


def _model(model_id: str, provider: str, upstream: str, max_output_tokens: int = 4096) -> str:
    return f"""
[models."{model_id}"]
provider = "{provider}"
upstream = "{upstream}"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
supports_tools = true
max_output_tokens = {max_output_tokens}
"""


# Gateways that fail the same providers on purpose, over and over: a breaker that opened
# would turn the failures under test into 503s (tests/inference/test_fallbacks.py tests it).
NO_BREAKER = "\n[routing]\nbreaker_failures = 1000000\n"


def inference_config(openai_url: str, anthropic_url: str) -> str:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    config = f"""
[providers.fakeai]
kind = "openai"
base_url = "{openai_url}/v1"
api_key_env = "FAKE_OPENAI_KEY"

[providers.fakeai-chatonly]
kind = "openai"
base_url = "{openai_url}/chatonly/v1"
api_key_env = "FAKE_OPENAI_KEY"

[providers.fakeanthropic]
kind = "anthropic"
base_url = "{anthropic_url}"
api_key_env = "FAKE_ANTHROPIC_KEY"

[providers.dead]
kind = "openai"
base_url = "{dead}"
api_key_env = "FAKE_OPENAI_KEY"

[providers.unset]
kind = "openai"
base_url = "{openai_url}/v1"
api_key_env = "GATEWAY_TEST_VARIABLE_NEVER_SET"
"""
    for prefix, provider in (
        ("oa", "fakeai"),
        ("oa-chat", "fakeai-chatonly"),
        ("an", "fakeanthropic"),
    ):
        for mode in MODES:
            config += _model(f"{prefix}/{mode}", provider, mode)
    config += _model("oa/small", "fakeai", "normal", max_output_tokens=64)
    config += _model("dead/normal", "dead", "normal")
    config += _model("unset/normal", "unset", "normal")
    return config


def read_sse(raw: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) of each event in a whole SSE body, in order."""
    events = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        events.append((name, "\n".join(data)))
    return events


def sse_payloads(raw: bytes) -> list:
    """The JSON payloads of a stream, `[DONE]` kept as the string."""
    return [data if data == "[DONE]" else orjson.loads(data) for _, data in read_sse(raw)]


def relay(events, renderer, reads: list[bytes]) -> bytes:
    """What `renderer` sends a client for an upstream stream arriving in `reads`, each
    read's batch of `events` (a ChatEvents or NativeResponsesEvents) in turn."""
    out = renderer.start()
    for read in reads:
        batch, failure = events.feed(read)
        assert failure is None
        out += renderer.feed(batch)
    assert events.complete
    return out + renderer.finish()


def split(raw: bytes, cuts: list[int]) -> list[bytes]:
    """`raw` cut at those offsets: the reads a stream may arrive in."""
    bounds = [0, *sorted(set(cuts)), len(raw)]
    return [raw[a:b] for a, b in itertools.pairwise(bounds)]


def by_class(input_tokens: int, output_tokens: int, **classes: int) -> dict[str, int]:
    """The usage an inference receipt shows: all input and output, and every class within
    them (0 when none): decisions.md, "Prices, exactly"."""
    return {
        "input_tokens": input_tokens,
        "cached_input_tokens": 0,
        "cache_write_tokens": 0,
        "output_tokens": output_tokens,
        "reasoning_tokens": 0,
        **classes,
    }
