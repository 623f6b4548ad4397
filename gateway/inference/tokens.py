"""Token estimates, for text whose usage no provider reported: ceil(UTF-8 bytes / 4).

The one helper metering relies on when a stream ends without usage: what was delivered
and the prompt it answered are both counted here, the same way.
"""

from __future__ import annotations

from typing import Any


def estimate_tokens(text: str) -> int:
    """ceil(utf-8 bytes / 4): 0 for empty text, at least 1 otherwise."""
    return -(-len(text.encode()) // 4)


def content_text(content: Any) -> str:
    """The text of a message content: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""


def chat_prompt_text(request: dict) -> str:
    """Everything a Chat Completions request asks the model to read."""
    parts: list[str] = []
    for message in request.get("messages", ()):
        parts.append(content_text(message.get("content")))
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            parts.append(function.get("name") or "")
            parts.append(function.get("arguments") or "")
    return "\n".join(part for part in parts if part)


def responses_prompt_text(request: dict) -> str:
    """Everything a Responses request asks the model to read."""
    parts: list[str] = [request.get("instructions") or ""]
    items = request.get("input")
    if isinstance(items, str):
        parts.append(items)
    else:
        for item in items or ():
            parts.append(content_text(item.get("content")))
            for name in ("name", "arguments", "output"):
                value = item.get(name)
                if isinstance(value, str):
                    parts.append(value)
    return "\n".join(part for part in parts if part)


def completion_text(completion: dict) -> str:
    """The output of a chat completion: text, refusal, tool names and arguments."""
    parts: list[str] = []
    for choice in completion.get("choices") or ():
        message = choice.get("message") or {}
        parts.append(content_text(message.get("content")))
        parts.append(message.get("refusal") or "")
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            parts.append((function.get("name") or "") + (function.get("arguments") or ""))
    return "".join(parts)


def response_text(response: dict) -> str:
    """The output of a Response object: message text, function names and arguments."""
    parts: list[str] = []
    for item in response.get("output") or ():
        if item.get("type") == "message":
            parts.append(content_text(item.get("content")))
        elif item.get("type") == "function_call":
            parts.append((item.get("name") or "") + (item.get("arguments") or ""))
    return "".join(parts)
