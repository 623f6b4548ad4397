"""Output never past the hold (decisions.md, "Prices, exactly").

The hold covers a request's output limit (its own, clamped to the model's) with the
tolerance of the gateway's own count: ceil(limit x 1.25) + 16 tokens (gateway.pricing). A stream's
delivered output is counted as it goes, as a receipt bills it when the upstream reports
no usage: UTF-8 bytes of the text the client receives, tokens = ceil(bytes / 4). Nothing
past the held amount is relayed: the event that crosses it is cut short (`cut_message`)
and the stream ends with the upstream's failure. Only counts are kept, never the events,
so an upstream that never ends a stream costs no memory and gets no free output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from model_gateway.gateway.inference.tokens import message_output, text_of
from model_gateway.gateway.inference.usage import token_count
from model_gateway.gateway.providers.upstream import UpstreamFailure

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject


def past_the_limit() -> UpstreamFailure:
    """The upstream sent more output than the hold covers: its failure, never a fallback
    (the client may already have part of it, or its input was billed)."""
    return UpstreamFailure(
        "output_limit",
        "The upstream provider sent more output than the request allows.",
        detail="output past the request's limit",
    )


def utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


class Delivered:
    """The output a stream delivered, in UTF-8 bytes, up to `held_tokens` x 4."""

    __slots__ = ("cut", "held_tokens", "room", "size")

    def __init__(self, held_tokens: int) -> None:
        self.size = 0
        self.held_tokens = held_tokens
        self.room = held_tokens * 4  # bytes the hold still covers
        self.cut = False  # something was not relayed: the stream must end, failed

    def take(self, size: int) -> bool:
        """Count `size` bytes more if the hold covers them; False (nothing counted) if not."""
        if size > self.room:
            return False
        self.room -= size
        self.size += size
        return True

    def cut_short(self, kept: int) -> None:
        """The crossing event was cut to `kept` bytes: counted, and nothing more relayed."""
        self.size += kept
        self.room, self.cut = 0, True

    def covers(self, reported: Any) -> bool:
        """Whether an upstream's output count is within the hold (a value that is no count
        is replaced by the gateway's count of what was delivered: gateway.inference.usage)."""
        count = token_count(reported)
        return count is None or count <= self.held_tokens


def delivered_chunk(
    delivered: Delivered, chunk: JSONObject, *, reasoning: bool = True
) -> JSONObject:
    """A chat chunk counted as delivered, or its prefix within the hold when it crosses it
    (`delivered.cut` then says so)."""
    choices = chunk.get("choices") or ()
    deltas = [choice.get("delta") or {} for choice in choices]
    size = sum(utf8_size(message_output(delta, reasoning=reasoning)) for delta in deltas)
    if delivered.take(size):
        return chunk
    room = delivered.room
    cut_choices = []
    for choice, delta in zip(choices, deltas, strict=True):
        kept = cut_message(delta, room, reasoning=reasoning)
        room -= utf8_size(message_output(kept, reasoning=reasoning))
        cut_choices.append({**choice, "delta": kept, "finish_reason": None})
    delivered.cut_short(delivered.room - room)
    return {**chunk, "choices": cut_choices}


def prefix_within(text: str, room: int) -> tuple[str, int]:
    """The longest prefix of `text` within `room` UTF-8 bytes, and the bytes left."""
    kept = text.encode()[:room].decode("utf-8", "ignore")
    return kept, room - len(kept.encode())


def cut_message(message: JSONObject, room: int, *, reasoning: bool = True) -> JSONObject:
    """`message` (a delta) with only the first `room` bytes of its output, in the order
    `tokens.message_output` counts it: content, refusal, audio, reasoning, tool calls, the
    legacy function call."""
    cut = dict(message)
    content = message.get("content")
    if isinstance(content, str):
        cut["content"], room = prefix_within(content, room)
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                part = dict(part)
                for field in ("text", "refusal"):
                    if isinstance(part.get(field), str):
                        part[field], room = prefix_within(part[field], room)
            parts.append(part)
        cut["content"] = parts
    if text_of(message.get("refusal")):
        cut["refusal"], room = prefix_within(message["refusal"], room)
    audio = message.get("audio")
    if isinstance(audio, dict):
        cut_audio = dict(audio)
        for field in ("data", "transcript"):
            if text_of(audio.get(field)):
                cut_audio[field], room = prefix_within(audio[field], room)
        cut["audio"] = cut_audio
    if reasoning:
        first, second = message.get("reasoning_content"), message.get("reasoning")
        if text_of(first) and text_of(first) == text_of(second):  # counted once: cut alike
            cut["reasoning_content"], room = prefix_within(text_of(first), room)
            cut["reasoning"] = cut["reasoning_content"]
        else:
            for field in ("reasoning_content", "reasoning"):
                if text_of(message.get(field)):
                    cut[field], room = prefix_within(message[field], room)
    calls = []
    for call in message.get("tool_calls") or ():
        function = dict(call.get("function") or {})
        for field in ("name", "arguments"):
            if text_of(function.get(field)):
                function[field], room = prefix_within(function[field], room)
        calls.append({**call, "function": function})
    if calls:
        cut["tool_calls"] = calls
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        function = dict(legacy)
        for field in ("name", "arguments"):
            if text_of(function.get(field)):
                function[field], room = prefix_within(function[field], room)
        cut["function_call"] = function
    return cut
