"""The built-in provider: answers with the last user (or tool) message, deterministically.

Needs nothing, counts tokens with the gateway's estimate, honours the output limit
(finish_reason "length"), streams word by word, and calls a tool when the request
forces one (tool_choice "required" or a named function), so that every path of the
gateway can be exercised on a fresh install.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import AsyncIterator

import orjson

from gateway.inference.tokens import chat_prompt_text, content_text, estimate_tokens
from gateway.providers.base import Provider

_PIECES = re.compile(r"\S+\s*|\s+")


class _Reply:
    def __init__(self, request: dict) -> None:
        messages = request.get("messages") or []
        asked = next((m for m in reversed(messages) if m.get("role") in ("user", "tool")), {})
        text = content_text(asked.get("content"))
        self.tool_call: dict | None = None
        self.finish_reason = "stop"
        forced = request.get("tool_choice")
        if (
            request.get("tools")
            and asked.get("role") != "tool"
            and forced not in (None, "auto", "none")
        ):
            name = (forced.get("function") or {}).get("name") if isinstance(forced, dict) else None
            name = name or (request["tools"][0].get("function") or {}).get("name") or "tool"
            arguments = orjson.dumps({"text": text}).decode()
            self.tool_call = {
                "id": "call_" + secrets.token_hex(8),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            self.finish_reason, text = "tool_calls", ""
        limit = request.get("max_completion_tokens") or request.get("max_tokens")
        if limit and estimate_tokens(text) > limit:
            text = text.encode()[: limit * 4].decode("utf-8", "ignore")
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

    async def chat(self, request: dict) -> dict:
        reply = _Reply(request)
        message: dict = {"role": "assistant", "content": reply.text, "refusal": None}
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

    async def chat_stream(self, request: dict) -> AsyncIterator[dict]:
        reply = _Reply(request)

        def chunk(delta: dict, finish_reason: str | None = None) -> dict:
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            return {
                "id": reply.id,
                "object": "chat.completion.chunk",
                "created": reply.created,
                "model": reply.model,
                "choices": [choice],
            }

        yield chunk({"role": "assistant", "content": ""})
        if reply.tool_call:
            yield chunk({"tool_calls": [{"index": 0, **reply.tool_call}]})
        for piece in _PIECES.findall(reply.text):
            await asyncio.sleep(0)  # one piece per turn of the loop, like a real stream
            yield chunk({"content": piece})
        yield chunk({}, reply.finish_reason)
        yield {**chunk({}), "choices": [], "usage": reply.usage}
