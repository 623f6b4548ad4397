"""Small request builders shared by the end-to-end tests."""

from __future__ import annotations


def bearer(key: str, scheme: str = "Bearer") -> dict[str, str]:
    return {"authorization": f"{scheme} {key}"}


def chat_body(model: str = "echo-1", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
