"""Messages <-> Chat Completions, for upstreams that do not speak Anthropic's API.

A Messages request becomes the neutral chat request: the system prompt a system message;
each turn a message, its tool_use blocks tool calls, its tool_result blocks tool
messages (before the turn's text: chat wants them right after the calls they answer);
tools and tool_choice their function forms; max_tokens, stop_sequences, temperature,
top_p and metadata.user_id their counterparts. What has none (top_k, thinking, cache
control, block types the gateway does not know) is dropped. A chat completion becomes a
Message: its text a text block, its tool calls tool_use blocks, its finish reason a
stop reason. Pure functions, no I/O.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import orjson

from model_gateway.gateway.inference.tokens import content_text, text_of

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

# Chat finish reasons as Messages stop reasons (any other: end_turn).
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def stop_reason(finish_reason: Any) -> str:
    """A chat finish reason as a stop reason."""
    return (
        STOP_REASONS.get(finish_reason, "end_turn")
        if isinstance(finish_reason, str)
        else "end_turn"
    )


def message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def tool_use_id() -> str:
    """An id for a tool call that came without one (Anthropic's clients need it)."""
    return "toolu_" + secrets.token_hex(12)


def _texts(blocks: list[JSONObject]) -> list[str]:
    return [block["text"] for block in blocks if block["type"] == "text" and block["text"]]


def _text_content(texts: list[str]) -> str | list[JSONObject]:
    """Text as chat content: one text as it is, several as text parts."""
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": text} for text in texts]


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    return "\n\n".join(_texts(system or []))


def _user(content: str | list[JSONObject]) -> list[JSONObject]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    turn = [
        {
            "role": "tool",
            "tool_call_id": block["tool_use_id"],
            "content": content_text(block.get("content")),
        }
        for block in content
        if block["type"] == "tool_result"
    ]
    texts = _texts(content)
    if texts:
        turn.append({"role": "user", "content": _text_content(texts)})
    return turn


def _assistant(content: str | list[JSONObject]) -> list[JSONObject]:
    if isinstance(content, str):
        return [{"role": "assistant", "content": content}] if content else []
    calls = [
        {
            "id": block["id"],
            "type": "function",
            "function": {"name": block["name"], "arguments": orjson.dumps(block["input"]).decode()},
        }
        for block in content
        if block["type"] == "tool_use"
    ]
    text = "".join(_texts(content))
    if not (text or calls):
        return []  # nothing a chat upstream reads (thinking, say)
    message: JSONObject = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _tool_choice(choice: JSONObject) -> str | JSONObject:
    kind: str = choice["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}
    return "required" if kind == "any" else kind  # auto and none are the same words


def chat_from_messages(request: JSONObject) -> JSONObject:
    """A (validated) Messages request as the neutral chat request."""
    messages: list[JSONObject] = []
    system = _system(request.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for message in request["messages"]:
        turn = _assistant if message["role"] == "assistant" else _user
        messages += turn(message["content"])
    chat: JSONObject = {
        "model": request["model"],
        "messages": messages,
        "max_completion_tokens": request["max_tokens"],
    }
    tools = request.get("tools")
    if tools:
        chat["tools"] = [_function(tool) for tool in tools]
        choice = request.get("tool_choice")
        if choice:
            chat["tool_choice"] = _tool_choice(choice)
            if choice.get("disable_parallel_tool_use") and choice["type"] != "none":
                chat["parallel_tool_calls"] = False
    for key in ("temperature", "top_p"):
        if key in request:
            chat[key] = request[key]
    if request.get("stop_sequences"):
        chat["stop"] = request["stop_sequences"]
    user = (request.get("metadata") or {}).get("user_id")
    if user:
        chat["user"] = user
    return chat


def _function(tool: JSONObject) -> JSONObject:
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def tool_input(arguments: Any) -> JSONObject:
    """A chat tool call's arguments as a tool_use block's input: the JSON object they
    hold; {} when they hold none (the model's mistake, which the client sees as such)."""
    try:
        value = orjson.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def message_from_chat(completion: JSONObject, model: str, usage: JSONObject) -> JSONObject:
    """A chat completion as a Message named `model`, showing `usage`."""
    choice = (completion.get("choices") or [{}])[0]
    reply = choice.get("message") or {}
    content: list[JSONObject] = []
    text = content_text(reply.get("content")) + text_of(reply.get("refusal"))
    if text:
        content.append({"type": "text", "text": text})
    for call in reply.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or tool_use_id(),
                "name": function.get("name") or "",
                "input": tool_input(function.get("arguments")),
            }
        )
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice.get("finish_reason")),
        "stop_sequence": None,
        "usage": usage,
    }
