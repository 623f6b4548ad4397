"""A chat stream passed through: the upstream speaks chat, so its events go out as they
came, byte for byte, but for what the client must see differently.

Per event (gateway.providers.chat_events has decoded and checked it), only bytes
operations: the upstream's model name becomes the gateway's model id by replacing the
one `"model":"<upstream name>"` the event holds, and `,"usage":null` (the upstream was
asked for usage) is cut when the client did not ask for it. An event that cannot be
treated so (its framing re-rendered, its fields not where expected, the usage chunk when
the client does not get it or gets the gateway's counts) is decoded and rendered as
`ChatRenderer` renders it. A key `"model":` or `"usage":` can only be a key in JSON text
(inside a string its quotes are escaped), so a count of one finds the field itself.

Of the delivered output only its size is kept (`_size`, read off the decoded event: no
second parse), for the receipt and for the output limit: an event that would cross what
the hold covers is decoded and rendered cut short (ChatStream.render), and the stream ends.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from model_gateway.gateway.inference.output_limit import Delivered, utf8_size
from model_gateway.gateway.inference.renderers import ChatStream, chat_tokens
from model_gateway.gateway.inference.sse import BLANK_LINE
from model_gateway.gateway.inference.tokens import reasoning_texts, text_of
from model_gateway.gateway.inference.usage import CHAT_KEYS, Prompt, shown_usage
from model_gateway.gateway.providers.chat_events import ChatEvent
from model_gateway.gateway.providers.shapes import ChatChunk
from model_gateway.gateway.providers.sse_blocks import parse_checked

_NULL_USAGE = b',"usage":null'


def _size(chunk: ChatChunk) -> int:
    """The UTF-8 size of the output a decoded chunk carries: what `tokens.message_output`
    counts of a decoded one (text, refusal, audio, reasoning, tool calls' and the legacy
    function call's names and arguments)."""
    size = 0
    for choice in chunk.choices or ():
        delta = choice.delta
        if delta is None:
            continue
        content = delta.content
        if isinstance(content, str):
            size += utf8_size(content)
        else:
            for part in content or ():
                size += utf8_size(part.text or "") + utf8_size(text_of(part.refusal))
        size += utf8_size(text_of(delta.refusal))
        for thought in reasoning_texts(delta.reasoning_content, delta.reasoning):
            size += utf8_size(thought)
        for call in delta.tool_calls or ():
            function = call.function
            if function is not None:
                size += utf8_size(function.name or "") + utf8_size(function.arguments or "")
        for extra, fields in (
            (delta.function_call, ("name", "arguments")),
            (delta.audio, ("data", "transcript")),
        ):
            if isinstance(extra, dict):
                size += sum(utf8_size(text_of(extra.get(field))) for field in fields)
    return size


class Renamer:
    """Puts the gateway's model id in place of the upstream's name in an event's bytes."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self._ours = b'"model":' + orjson.dumps(model_id)
        self._upstream_name: str | None = None
        self._theirs = b""  # `"model":"<upstream name>"`

    def renamed(self, block: bytes, model: Any) -> bytes | None:
        """`block` naming the model as the client asked for it, or None: re-render it (the
        name is not a string, or not found exactly once)."""
        if model == self.model_id:
            return block
        if type(model) is not str:
            return None
        if model != self._upstream_name:
            self._upstream_name, self._theirs = model, b'"model":' + orjson.dumps(model)
        if block.count(self._theirs) != 1:
            return None
        return block.replace(self._theirs, self._ours)


class ChatPassThrough(ChatStream):
    def __init__(
        self, model_id: str, include_usage: bool, prompt: Prompt, delivered: Delivered
    ) -> None:
        super().__init__(model_id, include_usage, prompt, delivered)
        self._renamer = Renamer(model_id)

    def feed(self, batch: list[ChatEvent]) -> bytes:
        out: list[bytes] = []
        for event in batch:
            block = self._passed(event)
            if block is not None and self.delivered.take(_size(event.chunk)):
                out += (block, BLANK_LINE)
                continue
            out.append(self.render(parse_checked(event.data)))  # as checked
            if self.delivered.cut:
                break  # nothing past the held output: the stream ends (streaming._body)
        return b"".join(out)

    def _passed(self, event: ChatEvent) -> bytes | None:
        """The event's bytes as the client gets them, or None: render it."""
        chunk, block = event.chunk, event.block
        if block is None:
            return None
        if not self.include_usage and not chunk.choices:
            return None  # the client gets nothing of it; usage it carries is billed
        usage = chunk.usage
        if usage:  # the usage chunk: passed only to who asked, and when shown as it came
            if not self.delivered.covers(chat_tokens(usage).get("output_tokens")):
                return None  # rendered: refused there
            shown = shown_usage(usage, self.prompt, self.delivered.size, CHAT_KEYS)
            if not self.include_usage or shown is not usage:
                return None
            self._usage = usage
        elif not self.include_usage and usage is not msgspec.UNSET:
            if usage is not None or block.count(_NULL_USAGE) != 1:
                return None
            block = block.replace(_NULL_USAGE, b"")
        return self._renamer.renamed(block, chunk.model)
