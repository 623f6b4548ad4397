"""Small helpers of the provider kinds' tests: a chat request, a marker that finds it at
the fake, what a stream said, and a wait for a log line."""

from __future__ import annotations

import time
import uuid

from tests.support.gateway_process import GatewayProcess

PROMPT = "Say something, please."


def marker() -> str:
    return "marker-" + uuid.uuid4().hex[:12]


def chat(model: str, text: str = PROMPT, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def stream_text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def finishes(chunks) -> list[str]:
    return [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]


def logged(gw: GatewayProcess, text: str) -> bool:
    deadline = time.monotonic() + 5
    while text not in gw.log():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
