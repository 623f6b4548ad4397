"""What one agent step did, kept with the step for the run's page and its API.

A model step keeps the messages sent new at that step (those after the model's last
reply: the instructions and the input at the first step, the tool results after) and the
model's reply (its text and tool calls); a sandbox step keeps its runtime, code, stdout,
stderr, exit code and status. Every text is cut at 64 KiB of UTF-8 and flagged (`truncated`
on a message, reply or call; `<field>_truncated` beside a sandbox field, as the execution
on /v1 says it), so a chatty program or model cannot bloat the database. Only these named
parts are copied: nothing of the request or answer beyond the run's own content.
"""

from __future__ import annotations

from typing import Any

from model_gateway.gateway.inference.tokens import content_text, text_of

TEXT_BYTES = 64 * 1024
MAX_ITEMS = 32  # messages of one step, tool calls of one reply: more are left out, flagged


def _cut(text: str) -> tuple[str, bool]:
    """The text, cut at TEXT_BYTES of UTF-8 (never inside a character); whether it was."""
    data = text.encode(errors="replace")
    if len(data) <= TEXT_BYTES:
        return text, False
    return data[:TEXT_BYTES].decode(errors="ignore"), True


def _with_text(item: dict[str, Any], name: str, text: str, flag: str = "truncated") -> None:
    item[name], cut = _cut(text)
    if cut:
        item[flag] = True


def _items(items: list[Any], owner: dict[str, Any], name: str) -> list[Any]:
    if len(items) > MAX_ITEMS:
        owner[f"{name}_truncated"] = True
    return items[:MAX_ITEMS]


def _message(message: dict[str, Any]) -> dict[str, Any]:
    item = {"role": text_of(message.get("role"))}
    _with_text(item, "content", content_text(message.get("content")))
    return item


def _call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    item = {"name": text_of(function.get("name"))}
    _with_text(item, "arguments", text_of(function.get("arguments")))
    return item


def model_transcript(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The messages new at this step and, when the model answered, its reply."""
    messages = request["messages"]
    replies = [n for n, message in enumerate(messages) if message.get("role") == "assistant"]
    new = messages[replies[-1] + 1 :] if replies else messages
    transcript: dict[str, Any] = {}
    transcript["messages"] = [_message(m) for m in _items(new, transcript, "messages")]
    choices = answer.get("choices") or [{}]
    message = choices[0].get("message")
    if message is not None:
        reply: dict[str, Any] = {}
        _with_text(
            reply, "content", content_text(message.get("content")) + text_of(message.get("refusal"))
        )
        calls = message.get("tool_calls") or []
        reply["tool_calls"] = [_call(call) for call in _items(calls, reply, "tool_calls")]
        transcript["reply"] = reply
    return transcript


def sandbox_transcript(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The program and, when it ran to an answer, its output, exit code and status."""
    transcript: dict[str, Any] = {"runtime": request["runtime"]}
    _with_text(transcript, "code", request["code"], "code_truncated")
    if answer:
        for stream in ("stdout", "stderr"):
            _with_text(transcript, stream, text_of(answer.get(stream)), f"{stream}_truncated")
            if answer.get(f"{stream}_truncated"):  # the node kept only its first 64 KiB
                transcript[f"{stream}_truncated"] = True
        transcript["exit_code"] = answer.get("exit_code")
        transcript["status"] = answer.get("status")
    return transcript


def step_transcript(kind: str, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The transcript of a step of `kind` that sent `request` and got `answer` ({} when
    the endpoint gave none: the step failed or was cancelled)."""
    if kind == "model":
        return model_transcript(request, answer)
    return sandbox_transcript(request, answer)
