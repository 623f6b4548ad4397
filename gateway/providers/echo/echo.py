"""The built-in provider: answers with the last user (or tool) message, deterministically.

Needs nothing, counts tokens with the gateway's estimate, honours the output limit
(finish_reason "length"), streams word by word, and calls a tool when the request
forces one (tool_choice "required" or a named function), so that every path of the
gateway can be exercised on a fresh install.

As an embedding model it answers each input with a deterministic unit vector of
`EMBEDDING_DIMENSIONS` values (or the request's `dimensions`), made from the SHAKE-256
digest of the input (a text, or a list of token ids: never the same digest): the same
input, the same vector. Fewer dimensions are the first values of a longer vector,
normalized again, as OpenAI's text-embedding-3 models shorten theirs.

It also plays a hosted agent's model (decisions.md, "Hosted agents"): offered the
`run_code` tool, it calls it for the first fenced code block whose info string is a
runtime (```python) in the last user or tool message, so a run with a sandbox step
works without any provider credentials. Requests without that tool are unaffected.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import secrets
import struct
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

import orjson

from model_gateway.gateway.agents.run_code import RUN_CODE
from model_gateway.gateway.inference.tokens import chat_prompt_text, content_text, estimate_tokens
from model_gateway.gateway.providers.chunks import completion_chunk
from model_gateway.gateway.providers.upstream import Acceptance, Provider
from model_gateway.gateway.sandbox.runtimes import RUNTIMES
from model_gateway.pipeline.errors import InvalidRequest

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

_PIECES = re.compile(r"\S+\s*|\s+")

EMBEDDING_DIMENSIONS = 8  # a vector's length when the request names none
# The most values one embeddings request is answered (inputs x dimensions): the answer
# is computed in the event loop.
MAX_EMBEDDING_VALUES = 1 << 18

_FENCED = re.compile(rf"```({'|'.join(RUNTIMES)})[ \t]*\r?\n(.*?)```", re.DOTALL)


def _offers_run_code(request: JSONObject) -> bool:
    if request.get("tool_choice") == "none":
        return False
    return any(
        isinstance(tool, dict) and (tool.get("function") or {}).get("name") == RUN_CODE
        for tool in request.get("tools") or ()
    )


def _tool_call(name: str, arguments: JSONObject) -> JSONObject:
    return {
        "id": "call_" + secrets.token_hex(8),
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }


def _run_code_call(text: str) -> JSONObject | None:
    """A run_code call for the first fenced block of a runtime in `text`, or None."""
    block = _FENCED.search(text)
    if block is None:
        return None
    return _tool_call(RUN_CODE, {"runtime": block.group(1), "code": block.group(2)})


def _within(text: str, size: int | None) -> str:
    """`text` cut to `size` UTF-8 bytes (None: whole)."""
    return text if size is None else text.encode()[:size].decode("utf-8", "ignore")


def embedding(item: str | list[int], dimensions: int) -> list[float]:
    """The unit vector of an input (a text or token ids), in float32 values (as OpenAI's
    are: its base64 form holds them exactly)."""
    seed = orjson.dumps(item)  # a text is quoted: never the digest of token ids
    words = struct.unpack(f"<{dimensions}I", hashlib.shake_256(seed).digest(4 * dimensions))
    values = [(2 * word + 1) / 2**32 - 1 for word in words]  # in (-1, 1), never 0
    norm = math.sqrt(sum(value * value for value in values))
    unit = [value / norm for value in values]
    return list(struct.unpack(f"<{dimensions}f", struct.pack(f"<{dimensions}f", *unit)))


def _embedding_tokens(item: str | list[int]) -> int:
    return estimate_tokens(item) if isinstance(item, str) else len(item)


class _Reply:
    def __init__(self, request: JSONObject) -> None:
        messages = request.get("messages") or []
        asked: JSONObject = next(
            (m for m in reversed(messages) if m.get("role") in ("user", "tool")), {}
        )
        text = content_text(asked.get("content"))
        self.tool_call: JSONObject | None = None
        self.finish_reason = "stop"
        forced = request.get("tool_choice")
        limit: int | None = request.get("max_completion_tokens") or request.get("max_tokens")
        if _offers_run_code(request):
            self.tool_call = _run_code_call(text)
        if (
            self.tool_call is None
            and request.get("tools")
            and asked.get("role") != "tool"
            and forced not in (None, "auto", "none")
        ):
            name = (forced.get("function") or {}).get("name") if isinstance(forced, dict) else None
            name = name or (request["tools"][0].get("function") or {}).get("name") or "tool"
            # The arguments echo the text: within the output limit, as a model's would be.
            room = None if limit is None else max(0, limit * 4 - len(name) - len('{"text":""}'))
            self.tool_call = _tool_call(name, {"text": _within(text, room)})
        if self.tool_call:
            self.finish_reason, text = "tool_calls", ""
        if limit and estimate_tokens(text) > limit:
            text = _within(text, limit * 4)
            self.finish_reason = "length"
        self.text = text
        output = text
        if self.tool_call:
            output += self.tool_call["function"]["name"] + self.tool_call["function"]["arguments"]
        prompt = estimate_tokens(chat_prompt_text(request))
        completion = estimate_tokens(output)
        self.usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        self.id = "chatcmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = request["model"]


class EchoProvider(Provider):
    kind = "echo"

    # In process: the request is accepted as soon as it is asked.

    async def chat(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        acceptance.accept()
        reply = _Reply(request)
        message: JSONObject = {"role": "assistant", "content": reply.text, "refusal": None}
        if reply.tool_call:
            message["content"] = None
            message["tool_calls"] = [reply.tool_call]
        return {
            "id": reply.id,
            "object": "chat.completion",
            "created": reply.created,
            "model": reply.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": reply.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": reply.usage,
        }

    async def chat_stream(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[JSONObject]:
        acceptance.accept()
        reply = _Reply(request)

        def chunk(delta: JSONObject, finish_reason: str | None = None) -> JSONObject:
            return completion_chunk(reply.id, reply.created, reply.model, delta, finish_reason)

        yield chunk({"role": "assistant", "content": ""})
        if reply.tool_call:
            yield chunk({"tool_calls": [{"index": 0, **reply.tool_call}]})
        for piece in _PIECES.findall(reply.text):
            await asyncio.sleep(0)  # one piece per turn of the loop, like a real stream
            yield chunk({"content": piece})
        yield chunk({}, reply.finish_reason)
        yield {**chunk({}), "choices": [], "usage": reply.usage}

    async def embeddings(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        inputs: list[str | list[int]] = request["input"]
        dimensions: int = request.get("dimensions", EMBEDDING_DIMENSIONS)
        if len(inputs) * dimensions > MAX_EMBEDDING_VALUES:
            raise InvalidRequest(
                f"The echo provider answers at most {MAX_EMBEDDING_VALUES} values a request "
                "(inputs x dimensions).",
                param="dimensions",
            )
        acceptance.accept()
        tokens = sum(_embedding_tokens(item) for item in inputs)
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": embedding(item, dimensions)}
                for i, item in enumerate(inputs)
            ],
            "model": request["model"],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
