"""/v1/messages passed through to an Anthropic upstream: its answer and its stream go out
as they came, byte for byte, but for the model's name (the client's, `ctx.payload.model`)
and usage with a count that is none (the billed counts in its place: messages_usage).

A stream's events keep their bytes (gateway.providers.anthropic.messages_events): the
name in `message_start` is replaced with bytes operations (passthrough.Renamer), every
other event passes untouched unless its usage must show other counts. Of the output only
its size is kept, read off the decoded event (text, tool input JSON, thinking and its
signature, a redacted block's data), for the receipt and the output limit: the event
that crosses what the hold covers is cut short and the stream ends (streaming._body).
The usage billed is the stream's: input from `message_start` (and `message_delta` when
it repeats it), output from `message_delta` only (`message_start`'s is a placeholder,
before any output: a stream that fails before its end bills what it delivered).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from model_gateway.gateway.inference.messages.messages_stream import error_event
from model_gateway.gateway.inference.messages.messages_usage import (
    native_counts,
    shown_native_usage,
)
from model_gateway.gateway.inference.output_limit import Delivered, prefix_within, utf8_size
from model_gateway.gateway.inference.passthrough import Renamer
from model_gateway.gateway.inference.sse import BLANK_LINE, named_event
from model_gateway.gateway.inference.tokens import text_of
from model_gateway.gateway.inference.usage import Prompt, Text
from model_gateway.gateway.providers.anthropic.anthropic_messages import merge_usage
from model_gateway.gateway.providers.anthropic.messages_events import (
    OUTPUT_FIELDS,
    MessagesStreamEvent,
    NativeAnswer,
    output_texts,
)
from model_gateway.gateway.providers.sse_blocks import parse_checked

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject
    from model_gateway.pipeline.errors import GatewayError


def native_output(message: JSONObject) -> str:
    """The output of a whole Messages answer, as its stream would have delivered it."""
    parts: list[str] = []
    for block in message.get("content") or ():
        parts += (text_of(block.get(field)) for field in OUTPUT_FIELDS)
        if isinstance(block.get("input"), dict) and block["input"]:
            parts.append(orjson.dumps(block["input"]).decode())
    return "".join(parts)


def native_body(answer: NativeAnswer, model_id: str, prompt: Prompt, output: Text) -> bytes:
    """A whole answer as the client gets it: its bytes with the model renamed, or, when
    that cannot be done so or its usage must show other counts, rendered again."""
    message = answer.message
    usage = message.get("usage")
    shown = shown_native_usage(usage, prompt, output) if "usage" in message else usage
    if shown is usage:
        renamed = Renamer(model_id).renamed(answer.data, message.get("model"))
        if renamed is not None:
            return renamed
    rendered = {**message, "model": model_id}
    if "usage" in message:
        rendered["usage"] = shown
    return orjson.dumps(rendered)


class MessagesPassThrough:
    """An Anthropic upstream's stream to the client."""

    def __init__(self, model_id: str, prompt: Prompt, delivered: Delivered) -> None:
        self.prompt = prompt
        self.delivered = delivered
        self._renamer = Renamer(model_id)
        self._usage: JSONObject = {}  # as reported, merged (anthropic_messages.merge_usage)

    def start(self) -> bytes:
        return b""

    def feed(self, batch: list[MessagesStreamEvent]) -> bytes:
        out: list[bytes] = []
        for item in batch:
            event = item.event
            texts = output_texts(event.content_block) + output_texts(event.delta)
            if texts and not self.delivered.take(sum(map(utf8_size, texts))):
                out.append(self._cut(item))
                break
            rendered = self._rendered(item)
            if self.delivered.cut:
                break  # usage past the hold: nothing more is relayed
            out.append(rendered)
        return b"".join(out)

    def _cut(self, item: MessagesStreamEvent) -> bytes:
        """The event that crosses the held output, cut short (see output_limit)."""
        payload = parse_checked(item.data)
        part = payload.get("delta") or payload.get("content_block")
        room = self.delivered.room
        for field in OUTPUT_FIELDS:
            if isinstance(part.get(field), str):
                part[field], room = prefix_within(part[field], room)
        self.delivered.cut_short(self.delivered.room - room)
        return named_event(item.name, payload)

    def _rendered(self, item: MessagesStreamEvent) -> bytes:
        name, data, block, event = item
        if event.type == "message_start" and event.message is not None:
            usage = event.message.usage
            start = dict(usage) if isinstance(usage, dict) else {}
            start.pop("output_tokens", None)  # a placeholder: not the output's count
            merge_usage(self._usage, start)
            shown = shown_native_usage(usage, self.prompt, 0)
            if block is not None and shown is usage:
                renamed = self._renamer.renamed(block, event.message.model)
                if renamed is not None:
                    return renamed + BLANK_LINE
            payload = parse_checked(data)
            payload["message"].update(model=self._renamer.model_id, usage=shown)
            return named_event(name, payload)
        if event.type == "message_delta":
            merge_usage(self._usage, event.usage)
            if not self.delivered.covers(self.usage().get("output_tokens")):
                self.delivered.cut_short(0)  # not relayed: usage past the hold
                return b""
            shown = shown_native_usage(self._usage, self.prompt, self.delivered.size)
            if shown is not self._usage:
                payload = parse_checked(data)
                payload["usage"] = shown
                return named_event(name, payload)
        if block is not None:
            return block + BLANK_LINE  # as it came: nothing in it is the gateway's
        return named_event(name, parse_checked(data))

    def finish(self) -> bytes:
        return b""

    def error(self, error: GatewayError, request_id: str) -> bytes:
        return error_event(error, request_id)

    def usage(self) -> dict[str, Any]:
        return native_counts(self._usage)
