"""Token estimates, for text whose usage no provider reported: ceil(UTF-8 bytes / 4).

The one helper metering relies on when a stream ends without usage: what was delivered
and the prompt it answered are both counted here, the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject


def estimate_tokens(text: str) -> int:
    """ceil(utf-8 bytes / 4): 0 for empty text, at least 1 otherwise."""
    return -(-len(text.encode()) // 4)


def text_of(value: Any) -> str:
    """A text an upstream sent, or "" when it sent something else where text belongs."""
    return value if isinstance(value, str) else ""


def content_text(content: Any) -> str:
    """The text of a message content: a string, or the text (or refusal) of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            text_of(part.get("text")) + text_of(part.get("refusal"))
            for part in content
            if isinstance(part, dict)
        )
    return ""


def reasoning_texts(reasoning_content: object, reasoning: object) -> tuple[str, ...]:
    """The reasoning a message carries, each field only when it is text: counted once when
    both say the same (recent vLLM fills `reasoning_content` and `reasoning` alike), both
    when they differ (an upstream may not hide one behind the other)."""
    first, second = text_of(reasoning_content), text_of(reasoning)
    return (first,) if first == second else (first, second)


def message_output(message: JSONObject, *, reasoning: bool = True) -> str:
    """The output a chat message (or a stream's delta) carries: its text, refusal, audio
    and reasoning, and its tool calls' (or legacy function call's) names and arguments.
    Reasoning is what OpenAI-compatible servers send beside the content (vLLM, llama.cpp,
    DeepSeek, Ollama): output the client receives."""
    text = content_text(message.get("content"))
    refusal, calls, legacy, audio = (
        message.get("refusal"),
        message.get("tool_calls"),
        message.get("function_call"),
        message.get("audio"),
    )
    thought = reasoning and (message.get("reasoning_content") or message.get("reasoning"))
    if not (refusal or calls or legacy or thought or audio):
        return text  # the common delta: text alone
    parts = [text, text_of(refusal)]
    if isinstance(audio, dict):  # audio output: its data (base64) and transcript
        parts += (text_of(audio.get("data")), text_of(audio.get("transcript")))
    if reasoning:
        parts += reasoning_texts(message.get("reasoning_content"), message.get("reasoning"))
    functions = [call.get("function") or {} for call in calls or ()]
    if isinstance(legacy, dict):
        functions.append(legacy)
    for function in functions:
        parts += (text_of(function.get("name")), text_of(function.get("arguments")))
    return "".join(parts)


def chat_prompt_text(request: JSONObject) -> str:
    """Everything a Chat Completions request asks the model to read."""
    parts: list[str] = []
    for message in request.get("messages", ()):
        parts.append(content_text(message.get("content")))
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            parts.append(function.get("name") or "")
            parts.append(function.get("arguments") or "")
    return "\n".join(part for part in parts if part)


def responses_prompt_text(request: JSONObject) -> str:
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


def _block_text(block: Any) -> str:
    """What a Messages content block asks the model to read: its text (or thinking), a
    tool call's name and input, a tool result's content."""
    if not isinstance(block, dict):
        return ""
    kind = block.get("type")
    if kind == "tool_use":
        return text_of(block.get("name")) + orjson.dumps(block.get("input")).decode()
    if kind == "tool_result":
        return messages_content_text(block.get("content"))
    return text_of(block.get("text")) + text_of(block.get("thinking"))


def messages_content_text(content: Any) -> str:
    """The text of a Messages content: a string, or its blocks' (`_block_text`)."""
    if isinstance(content, str):
        return content
    return "\n".join(filter(None, (_block_text(block) for block in content or ())))


def messages_prompt_text(request: JSONObject) -> str:
    """Everything a Messages request asks the model to read: the system prompt, the
    messages, and the tools it offers (names, descriptions, input schemas)."""
    parts = [messages_content_text(request.get("system"))]
    parts += (messages_content_text(message.get("content")) for message in request["messages"])
    for tool in request.get("tools") or ():
        parts += (text_of(tool.get("name")), text_of(tool.get("description")))
        parts.append(orjson.dumps(tool.get("input_schema")).decode())
    return "\n".join(part for part in parts if part)


def completion_text(completion: JSONObject, *, reasoning: bool = True) -> str:
    """The output of a chat completion (see `message_output`); `reasoning` False: what a
    translation into a Response delivers, which has no item for it."""
    return "".join(
        message_output(choice.get("message") or {}, reasoning=reasoning)
        for choice in completion.get("choices") or ()
    )


def response_text(response: JSONObject) -> str:
    """The output of a Response object: message text, reasoning (its summary and text),
    function names and arguments."""
    parts: list[str] = []
    for item in response.get("output") or ():
        if item.get("type") == "message":
            parts.append(content_text(item.get("content")))
        elif item.get("type") == "reasoning":
            parts += (content_text(item.get("summary")), content_text(item.get("content")))
        elif item.get("type") == "function_call":
            parts += (text_of(item.get("name")), text_of(item.get("arguments")))
    return "".join(parts)
