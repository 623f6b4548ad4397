"""What the gateway reads of an upstream's answers, as shapes checked at the boundary.

An upstream is not trusted to answer in the shape it documents: a `choices` that is a
string, a message that is a number, a tool call index that is a list would otherwise
surface deep in the translators and renderers as a 500 (or an in-band internal_error).
Each answer and each stream event is checked against the fields the gateway reads, and
one that does not fit is the upstream's failure: `malformed` (502 provider_error, or
in-band once a stream has started). Fields the gateway does not read are not checked;
usage is judged later, count by count (gateway.inference.usage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from model_gateway.gateway.providers.upstream import malformed

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

T = TypeVar("T")


class _Shape(msgspec.Struct, kw_only=True):
    """Unknown fields pass; every field is optional and may be null."""


class _Part(_Shape):
    type: str | None = None
    text: str | None = None
    refusal: Any = None  # counted as output when it is text (tokens.content_text)


_Content = str | list[_Part] | None


class _Function(_Shape):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(_Shape):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _Message(_Shape):
    content: _Content = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = None
    # Output that OpenAI-compatible servers send beside the content (vLLM, DeepSeek, ...):
    # read, not checked, to count it (tokens.message_output).
    reasoning_content: Any = None
    reasoning: Any = None
    function_call: Any = None  # the legacy form of a tool call: counted too
    audio: Any = None  # audio output (data, transcript): counted too


class _Choice(_Shape):
    message: _Message | None = None
    delta: _Message | None = None
    finish_reason: str | None = None


class ChatAnswer(_Shape):
    """A chat completion, or one of its stream's chunks."""

    choices: list[_Choice] | None = None
    created: int | None = None


class ChatChunk(ChatAnswer):
    """A chat stream's chunk, with what a pass-through reads besides its shape: the model
    name (renamed for the client), the usage (billed; UNSET when the chunk has no `usage`
    field, None when it is null) and an in-band error."""

    model: Any = None
    usage: Any = msgspec.UNSET
    error: Any = None


class _OutputItem(_Shape):
    type: str | None = None
    content: _Content = None
    name: str | None = None
    arguments: str | None = None


class ResponsesAnswer(_Shape):
    output: list[_OutputItem] | None = None


class ResponsesEvent(_Shape):
    """A native Responses stream's event, with the text delta a pass-through keeps."""

    type: str | None = None
    sequence_number: int | None = None
    response: ResponsesAnswer | None = None
    delta: Any = None


class _Block(_Shape):
    type: str | None = None
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


class MessagesAnswer(_Shape):
    """An Anthropic Messages answer."""

    id: str | None = None
    content: list[_Block] | None = None
    stop_reason: str | None = None


class _Delta(_Shape):
    type: str | None = None
    text: str | None = None
    partial_json: str | None = None
    stop_reason: str | None = None


class MessagesEvent(_Shape):
    """One event of an Anthropic Messages stream."""

    type: str | None = None
    index: int | None = None
    message: MessagesAnswer | None = None
    content_block: _Block | None = None
    delta: _Delta | None = None


def checked(provider: str, answer: JSONObject, shape: type[Any]) -> JSONObject:
    """`answer` itself, once it fits `shape`; else the upstream's malformed-answer error."""
    try:
        msgspec.convert(answer, shape)
    except msgspec.ValidationError:
        raise malformed(provider) from None
    return answer
