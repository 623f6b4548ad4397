"""Chat Completions <-> Anthropic Messages: requests, answers and stream events.

Pure functions and one small state machine, no I/O. System and developer messages
become `system`; tool messages become `tool_result` blocks in a user turn; consecutive
turns of one role merge (the Messages API wants them alternating).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from model_gateway.gateway.inference.tokens import content_text
from model_gateway.gateway.inference.usage import token_count
from model_gateway.gateway.providers.chunks import completion_chunk
from model_gateway.pipeline.errors import InvalidRequest

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

# Looked up with the answer's stop_reason, which may be null (shapes.MessagesAnswer).
STOP_REASONS: dict[str | None, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def text_blocks(content: Any, where: str) -> list[JSONObject]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for j, part in enumerate(content if isinstance(content, list) else ()):
        if part.get("type") != "text":
            raise InvalidRequest(
                "This content part type is not supported by this model.", param=f"{where}.{j}"
            )
        if part.get("text"):
            blocks.append({"type": "text", "text": part["text"]})
    return blocks


def tool_use_block(call: JSONObject, where: str) -> JSONObject:
    function = call.get("function") or {}
    try:
        arguments = orjson.loads(function.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        raise InvalidRequest(
            "Tool call arguments must be a JSON object.", param=f"{where}.function.arguments"
        )
    return {
        "type": "tool_use",
        "id": call.get("id"),
        "name": function.get("name"),
        "input": arguments,
    }


def _append(messages: list[JSONObject], role: str, blocks: list[JSONObject]) -> None:
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def tool_definitions(tools: list[JSONObject]) -> list[JSONObject]:
    translated = []
    for k, tool in enumerate(tools):
        function = tool.get("function") or {}
        if tool.get("type") != "function" or not function.get("name"):
            raise InvalidRequest(
                "Only function tools are supported by this model.", param=f"tools.{k}"
            )
        entry = {
            "name": function["name"],
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            entry["description"] = function["description"]
        translated.append(entry)
    return translated


def _tool_choice(choice: Any, parallel: bool | None) -> JSONObject:
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        translated = {"type": "tool", "name": name}
    else:
        translated = {"type": {"required": "any", "none": "none"}.get(choice, "auto")}
    if parallel is False and translated["type"] != "none":
        translated["disable_parallel_tool_use"] = True
    return translated


def messages_request(request: JSONObject) -> JSONObject:
    """A Chat Completions request (with its output limit set) as a Messages request."""
    system: list[str] = []
    messages: list[JSONObject] = []
    for i, message in enumerate(request["messages"]):
        role = message["role"]
        if role in ("system", "developer"):
            system.append(content_text(message.get("content")))
        elif role in ("tool", "function"):
            result = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id") or message.get("name") or "",
                "content": content_text(message.get("content")),
            }
            _append(messages, "user", [result])
        else:
            blocks = text_blocks(message.get("content"), f"messages.{i}.content")
            for k, call in enumerate(message.get("tool_calls") or ()):
                blocks.append(tool_use_block(call, f"messages.{i}.tool_calls.{k}"))
            _append(messages, "assistant" if role == "assistant" else "user", blocks)
    body: dict[str, Any] = {
        "model": request["model"],
        "messages": messages,
        "max_tokens": request.get("max_completion_tokens") or request.get("max_tokens"),
    }
    if any(system):
        body["system"] = "\n\n".join(text for text in system if text)
    if request.get("tools"):
        body["tools"] = tool_definitions(request["tools"])
        if "tool_choice" in request or "parallel_tool_calls" in request:
            body["tool_choice"] = _tool_choice(
                request.get("tool_choice", "auto"), request.get("parallel_tool_calls")
            )
    if "temperature" in request:
        body["temperature"] = min(request["temperature"], 1.0)  # OpenAI's 0..2, Anthropic's 0..1
    if "top_p" in request:
        body["top_p"] = request["top_p"]
    stop = request.get("stop")
    if stop:
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if request.get("user"):
        body["metadata"] = {"user_id": request["user"]}
    return body


def _sum_of_counts(usage: JSONObject, required: str, *optional: str) -> int | None:
    """The sum of counts, or None when one is not a count (the gateway then counts).
    The API sends null for the optional ones (cache counts) when it has none."""
    values = [usage.get(required)]
    values += [usage.get(name) if usage.get(name) is not None else 0 for name in optional]
    counts = [token_count(value) for value in values]
    if any(count is None for count in counts):
        return None
    return sum(count for count in counts if count is not None)


def chat_usage(usage: Any) -> JSONObject:
    """Messages usage as chat usage; a count the upstream broke stays None, never a guess."""
    if not isinstance(usage, dict):
        usage = {}
    cached = token_count(usage.get("cache_read_input_tokens", 0)) or 0
    writes = token_count(usage.get("cache_creation_input_tokens", 0)) or 0
    # Anthropic reports 1-hour cache writes apart (priced apart) within the writes.
    split = usage.get("cache_creation")
    one_hour = split.get("ephemeral_1h_input_tokens") if isinstance(split, dict) else None
    prompt = _sum_of_counts(
        usage, "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"
    )
    completion = _sum_of_counts(usage, "output_tokens")
    total = None if prompt is None or completion is None else prompt + completion
    details = {"cached_tokens": cached, "cache_write_tokens": writes}
    if one_hour:
        details["cache_write_1h_tokens"] = token_count(one_hour) or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "prompt_tokens_details": details,
    }


def merge_usage(merged: JSONObject, usage: Any) -> None:
    """Add a stream event's usage to what the stream reported so far. Later events repeat
    the counts they change; null is "not reported here", while any other value, even no
    count, is kept for `chat_usage` to judge."""
    if isinstance(usage, dict):
        merged.update({key: value for key, value in usage.items() if value is not None})


def chat_completion(message: JSONObject, model: str) -> JSONObject:
    """A Messages answer as a chat completion."""
    content = message.get("content") or []
    text = "".join(block.get("text") or "" for block in content if block.get("type") == "text")
    calls = [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {
                "name": block.get("name"),
                "arguments": orjson.dumps(block.get("input") or {}).decode(),
            },
        }
        for block in content
        if block.get("type") == "tool_use"
    ]
    reply: dict[str, Any] = {
        "role": "assistant",
        "content": text or (None if calls else ""),
        "refusal": None,
    }
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + str(message.get("id") or ""),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": STOP_REASONS.get(message.get("stop_reason"), "stop"),
                "logprobs": None,
            }
        ],
        "usage": chat_usage(message.get("usage")),
    }


class ChunkTranslator:
    """Messages stream events in, chat completion chunks out (then a usage chunk)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = "chatcmpl-"
        self.created = int(time.time())
        # content block index (None when the upstream sent null) -> tool call index
        self.tool_calls: dict[int | None, int] = {}
        self.finish_reason = "stop"
        self.usage: dict[str, Any] = {}  # as reported: chat_usage checks the counts
        self.done = False

    def _chunk(self, delta: JSONObject, finish_reason: str | None = None) -> JSONObject:
        return completion_chunk(self.id, self.created, self.model, delta, finish_reason)

    def _count(self, usage: Any) -> None:
        merge_usage(self.usage, usage)

    def feed(self, event: JSONObject) -> list[JSONObject]:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self.id = "chatcmpl-" + str(message.get("id") or "")
            self._count(message.get("usage"))
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            return self._block_start(event.get("index"), event.get("content_block") or {})
        if kind == "content_block_delta":
            return self._block_delta(event.get("index"), event.get("delta") or {})
        if kind == "message_delta":
            reason = (event.get("delta") or {}).get("stop_reason")
            self.finish_reason = STOP_REASONS.get(reason, "stop")
            self._count(event.get("usage"))
            return []
        if kind == "message_stop":
            self.done = True
            usage_chunk = {**self._chunk({}), "choices": [], "usage": chat_usage(self.usage)}
            return [self._chunk({}, self.finish_reason), usage_chunk]
        return []  # ping, content_block_stop, thinking and what a later API version adds

    def _block_start(self, index: int | None, block: JSONObject) -> list[JSONObject]:
        if block.get("type") == "tool_use":
            call = self.tool_calls[index] = len(self.tool_calls)
            function = {"name": block.get("name"), "arguments": ""}
            delta = {"index": call, "id": block.get("id"), "type": "function", "function": function}
            return [self._chunk({"tool_calls": [delta]})]
        if block.get("type") == "text" and block.get("text"):
            return [self._chunk({"content": block["text"]})]
        return []

    def _block_delta(self, index: int | None, delta: JSONObject) -> list[JSONObject]:
        if delta.get("type") == "text_delta":
            return [self._chunk({"content": delta.get("text") or ""})]
        if delta.get("type") == "input_json_delta" and index in self.tool_calls:
            arguments = {"arguments": delta.get("partial_json") or ""}
            return [
                self._chunk(
                    {"tool_calls": [{"index": self.tool_calls[index], "function": arguments}]}
                )
            ]
        return []
