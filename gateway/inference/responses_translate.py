"""Responses <-> Chat Completions, for providers without a Responses endpoint.

`chat_request` turns a Responses request into a chat request; `response_from_chat` turns
the completion back into a Response object. The stream counterpart is `responses_stream`.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

from model_gateway.gateway.inference.tokens import content_text, text_of
from model_gateway.gateway.inference.usage import token_count
from model_gateway.pipeline.errors import InvalidRequest

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_SKIPPED_ITEMS = frozenset({"reasoning"})


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _chat_content(content: Any, where: str) -> str | list[JSONObject]:
    if isinstance(content, str) or content is None:
        return content or ""
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text") or ""})
        elif kind == "refusal":
            parts.append({"type": "text", "text": part.get("refusal") or ""})
        else:
            raise InvalidRequest(
                "This content part type is not supported by this model.", param=f"{where}.{j}"
            )
    return parts


def _messages(request: JSONObject) -> list[JSONObject]:
    messages: list[JSONObject] = []
    if request.get("instructions"):
        messages.append({"role": "system", "content": request["instructions"]})
    items = request["input"]
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    for i, item in enumerate(items):
        kind = item.get("type") or "message"
        if kind == "message":
            role = item.get("role") or "user"
            role = "system" if role == "developer" else role  # chat-only servers know "system"
            messages.append(
                {"role": role, "content": _chat_content(item.get("content"), f"input.{i}.content")}
            )
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind not in _SKIPPED_ITEMS:
            raise InvalidRequest(
                "This input item type is not supported by this model.", param=f"input.{i}"
            )
    return messages


def _tools(tools: list[JSONObject]) -> list[JSONObject]:
    translated = []
    for k, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise InvalidRequest(
                "Only function tools are supported by this model.", param=f"tools.{k}"
            )
        function = {
            key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool
        }
        translated.append({"type": "function", "function": function})
    return translated


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice.get("type") in ("auto", "none", "required"):
        return choice["type"]
    raise InvalidRequest("This tool_choice is not supported by this model.", param="tool_choice")


def _response_format(text: JSONObject) -> JSONObject | None:
    fmt = text.get("format") or {}
    if fmt.get("type") == "json_schema":
        schema = {
            key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt
        }
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None


def chat_request(request: JSONObject) -> JSONObject:
    """A Responses request (upstream model and limit already set) as a chat request."""
    chat: dict[str, Any] = {"model": request["model"], "messages": _messages(request)}
    if request.get("tools"):
        chat["tools"] = _tools(request["tools"])
    if "tool_choice" in request:
        chat["tool_choice"] = _tool_choice(request["tool_choice"])
    for key in ("temperature", "top_p", "parallel_tool_calls", "user"):
        if key in request:
            chat[key] = request[key]
    if "max_output_tokens" in request:
        chat["max_completion_tokens"] = request["max_output_tokens"]
    response_format = _response_format(request.get("text") or {})
    if response_format:
        chat["response_format"] = response_format
    effort = (request.get("reasoning") or {}).get("effort")
    if effort:
        chat["reasoning_effort"] = effort
    return chat


def _detail(usage: JSONObject, details: str, name: str) -> int:
    """A count inside chat usage's details; 0 when the upstream sent none, or no count."""
    inner = usage.get(details)
    return (token_count(inner.get(name)) if isinstance(inner, dict) else None) or 0


def response_usage(usage: Any) -> JSONObject | None:
    """Chat usage (its counts already checked, see usage.shown_usage) as Responses usage."""
    if not usage or not isinstance(usage, dict):
        return None
    prompt = token_count(usage.get("prompt_tokens")) or 0
    completion = token_count(usage.get("completion_tokens")) or 0
    cached = _detail(usage, "prompt_tokens_details", "cached_tokens")
    reasoning = _detail(usage, "completion_tokens_details", "reasoning_tokens")
    return {
        "input_tokens": prompt,
        # OpenAI's schema requires both; a chat upstream reports no cache writes.
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


# A message part's kind, and the field that holds its text; its stream events are named
# `response.<kind>.delta` and `.done`.
PART_TEXT = {"output_text": "text", "refusal": "refusal"}


def message_item(item_id: str, text: str, status: str, kind: str = "output_text") -> JSONObject:
    """A message of one part: output text, or (kind "refusal") the model's refusal."""
    part: dict[str, object] = {"type": kind, PART_TEXT[kind]: text}
    if kind == "output_text":
        part |= {"annotations": [], "logprobs": []}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> JSONObject:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def ending(finish_reason: str | None) -> tuple[str, JSONObject | None]:
    """The Response status and incomplete_details for a chat finish_reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def response_object(
    request: JSONObject,
    *,
    response_id: str,
    created_at: int,
    status: str,
    output: list[JSONObject],
    usage: JSONObject | None,
    incomplete: JSONObject | None = None,
) -> JSONObject:
    """A Response object; `request` is the client's Responses request."""
    response = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": request["model"],
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": {"effort": (request.get("reasoning") or {}).get("effort"), "summary": None},
        "store": False,
        "temperature": request.get("temperature", 1.0),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools", []),
        "top_p": request.get("top_p", 1.0),
        "truncation": request.get("truncation", "disabled"),
        "metadata": request.get("metadata", {}),
    }
    # Optional and not nullable in OpenAI's schema: absent rather than null.
    optional = {"usage": usage, "user": request.get("user")}
    return response | {name: value for name, value in optional.items() if value is not None}


def response_from_chat(completion: JSONObject, request: JSONObject) -> JSONObject:
    """A chat completion as the Response to `request` (the client's Responses request)."""
    choices = completion.get("choices") or [{}]
    message = choices[0].get("message") or {}
    status, incomplete = ending(choices[0].get("finish_reason"))
    calls = message.get("tool_calls") or []
    text, refusal = content_text(message.get("content")), text_of(message.get("refusal"))
    output = []
    if text or not (calls or refusal):
        output.append(message_item(new_id("msg"), text, status))
    if refusal:
        output.append(message_item(new_id("msg"), refusal, status, "refusal"))
    for call in calls:
        function = call.get("function") or {}
        output.append(
            function_call_item(
                new_id("fc"),
                call.get("id") or new_id("call"),
                function.get("name") or "",
                function.get("arguments") or "",
                "completed",
            )
        )
    return response_object(
        request,
        response_id=new_id("resp"),
        created_at=int(completion.get("created") or time.time()),
        status=status,
        output=output,
        usage=response_usage(completion.get("usage")),
        incomplete=incomplete,
    )
