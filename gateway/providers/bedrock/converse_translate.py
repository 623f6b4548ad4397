"""Chat Completions <-> Bedrock Converse: requests, answers and stream events.

Pure functions, shapes and one small state machine, no I/O. Converse's conversation
model is Anthropic's under other names (content blocks, tool results in a user turn,
alternating roles, usage without cache reads and writes in its input count), so the
translation goes through the Messages form of `anthropic_messages`: the chat request is
made a Messages request (system gathered, turns merged, tool arguments and content parts
checked with their `param` paths) and renamed into Converse; Converse answers and events
are renamed into Messages ones and read by its translators. What Converse has and
Messages has not is added here: cache writes in the usage, the stop reasons of Bedrock's
filters.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import msgspec

from model_gateway.gateway.providers.anthropic import anthropic_messages

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

# Bedrock's stop reasons under Anthropic's names where they differ (end_turn, tool_use,
# max_tokens, stop_sequence, model_context_window_exceeded are the same words); unknown
# ones (malformed_model_output, ...) are "stop".
_STOP_REASONS = {"content_filtered": "refusal", "guardrail_intervened": "refusal"}


# --- what is read of an answer or an event: checked at the boundary (shapes.checked) ----


class _Shape(msgspec.Struct, kw_only=True):
    """Unknown fields pass; every field is optional and may be null."""


class _ToolUse(_Shape):
    toolUseId: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


class _Block(_Shape):
    text: str | None = None
    toolUse: _ToolUse | None = None
    reasoningContent: Any = None  # not shown; its tokens are in outputTokens


class _Message(_Shape):
    content: list[_Block] | None = None


class _Output(_Shape):
    message: _Message | None = None


class ConverseAnswer(_Shape):
    """A Converse answer (`usage` is judged count by count, not here)."""

    output: _Output | None = None
    stopReason: str | None = None
    usage: Any = None


class _ToolStart(_Shape):
    toolUseId: str | None = None
    name: str | None = None


class _Start(_Shape):
    toolUse: _ToolStart | None = None


class _ToolInput(_Shape):
    input: str | None = None


class _Delta(_Shape):
    text: str | None = None
    toolUse: _ToolInput | None = None
    reasoningContent: Any = None


class ConverseEvent(_Shape):
    """The payload of any ConverseStream event (their fields do not overlap)."""

    contentBlockIndex: int | None = None
    start: _Start | None = None
    delta: _Delta | None = None
    stopReason: str | None = None
    usage: Any = None


# --- requests ----------------------------------------------------------------------------


def _block(block: JSONObject) -> JSONObject:
    """A Messages content block as a Converse one (messages_request makes only these)."""
    kind = block["type"]
    if kind == "text":
        return {"text": block["text"]}
    if kind == "tool_use":
        return {
            "toolUse": {"toolUseId": block["id"], "name": block["name"], "input": block["input"]}
        }
    result = {"toolUseId": block["tool_use_id"], "content": [{"text": block["content"]}]}
    return {"toolResult": result}


def _tool_config(tools: list[JSONObject], choice: JSONObject | None) -> JSONObject | None:
    """Converse's toolConfig; None when the tools are not to be used (tool_choice "none")."""
    kind = (choice or {}).get("type", "auto")
    if kind == "none":
        return None
    specs = []
    for tool in tools:
        spec: dict[str, Any] = {"name": tool["name"], "inputSchema": {"json": tool["input_schema"]}}
        if tool.get("description"):
            spec["description"] = tool["description"]
        specs.append({"toolSpec": spec})
    config: dict[str, Any] = {"tools": specs}
    # Left out unless asked: not every model on Bedrock takes toolChoice (auto is its default).
    if kind == "tool":
        config["toolChoice"] = {"tool": {"name": (choice or {}).get("name")}}
    elif choice is not None:
        config["toolChoice"] = {"any": {}} if kind == "any" else {"auto": {}}
    return config


def converse_request(request: JSONObject) -> JSONObject:
    """A Chat Completions request (with its output limit set) as a Converse request. The
    model is not in it: it is in the path."""
    messages = anthropic_messages.messages_request(request)
    inference: dict[str, Any] = {"maxTokens": messages["max_tokens"]}
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("stop_sequences", "stopSequences"),
    ):
        if ours in messages:
            inference[theirs] = messages[ours]
    body: dict[str, Any] = {
        "messages": [
            {"role": turn["role"], "content": [_block(block) for block in turn["content"]]}
            for turn in messages["messages"]
        ],
        "inferenceConfig": inference,
    }
    if messages.get("system"):
        body["system"] = [{"text": messages["system"]}]
    if messages.get("tools"):
        config = _tool_config(messages["tools"], messages.get("tool_choice"))
        if config is not None:
            body["toolConfig"] = config
    return body


# --- answers -----------------------------------------------------------------------------


def chat_usage(usage: Any) -> JSONObject:
    """Converse usage as chat usage: all input in prompt_tokens, cache reads and writes as
    its details; a count the upstream broke stays None, never a guess."""
    if not isinstance(usage, dict):
        usage = {}
    return anthropic_messages.chat_usage(
        {
            "input_tokens": usage.get("inputTokens"),
            "output_tokens": usage.get("outputTokens"),
            "cache_read_input_tokens": usage.get("cacheReadInputTokens"),
            "cache_creation_input_tokens": usage.get("cacheWriteInputTokens"),
        }
    )


def _stop_reason(reason: str | None) -> str | None:
    return _STOP_REASONS.get(reason, reason) if reason is not None else None


def chat_completion(answer: JSONObject, model: str) -> JSONObject:
    """A (checked) Converse answer as a chat completion."""
    message = (answer.get("output") or {}).get("message") or {}
    blocks: list[JSONObject] = []
    for block in message.get("content") or ():
        if block.get("text") is not None:
            blocks.append({"type": "text", "text": block["text"]})
        elif block.get("toolUse") is not None:
            use = block["toolUse"]
            blocks.append(
                {
                    "type": "tool_use",
                    "id": use.get("toolUseId"),
                    "name": use.get("name"),
                    "input": use.get("input"),
                }
            )
    completion = anthropic_messages.chat_completion(
        {
            "id": uuid.uuid4().hex,  # Converse answers have no id
            "content": blocks,
            "stop_reason": _stop_reason(answer.get("stopReason")),
        },
        model,
    )
    completion["usage"] = chat_usage(answer.get("usage"))
    return completion


class ConverseChunks:
    """ConverseStream events in (event type, checked payload), chat chunks out, then the
    usage chunk. The stream is complete (`done`) with `metadata`, which follows
    `messageStop` and carries the usage."""

    def __init__(self, model: str) -> None:
        self.translator = anthropic_messages.ChunkTranslator(model)
        self.done = False

    def feed(self, event_type: str | None, event: JSONObject) -> list[JSONObject]:
        index = event.get("contentBlockIndex")
        if event_type == "messageStart":
            message = {"id": uuid.uuid4().hex}
            return self.translator.feed({"type": "message_start", "message": message})
        if event_type == "contentBlockStart":
            tool = (event.get("start") or {}).get("toolUse")
            if tool is None:
                return []
            block = {"type": "tool_use", "id": tool.get("toolUseId"), "name": tool.get("name")}
            return self.translator.feed(
                {"type": "content_block_start", "index": index, "content_block": block}
            )
        if event_type == "contentBlockDelta":
            return self._delta(index, event.get("delta") or {})
        if event_type == "messageStop":
            delta = {"stop_reason": _stop_reason(event.get("stopReason"))}
            return self.translator.feed({"type": "message_delta", "delta": delta})
        if event_type == "metadata":
            self.done = True
            *chunks, usage_chunk = self.translator.feed({"type": "message_stop"})
            usage_chunk["usage"] = chat_usage(event.get("usage"))
            return [*chunks, usage_chunk]
        return []  # contentBlockStop, and what a later API version adds

    def _delta(self, index: int | None, delta: JSONObject) -> list[JSONObject]:
        if delta.get("text") is not None:
            text = {"type": "text_delta", "text": delta["text"]}
            return self.translator.feed(
                {"type": "content_block_delta", "index": index, "delta": text}
            )
        tool = delta.get("toolUse")
        if tool is not None:
            partial = {"type": "input_json_delta", "partial_json": tool.get("input") or ""}
            return self.translator.feed(
                {"type": "content_block_delta", "index": index, "delta": partial}
            )
        return []  # reasoningContent: not shown (its tokens are in the usage's output)
