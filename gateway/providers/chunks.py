"""The chat completion chunk every translated stream is made of (the neutral stream)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject


def completion_chunk(
    chunk_id: str, created: int, model: str, delta: JSONObject, finish_reason: str | None = None
) -> JSONObject:
    """One chunk of a chat completion stream with one choice."""
    return {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }
