"""An OpenAI chat stream read as it arrives: one batch of whole, checked events per read.

The pass-through (gateway.inference.passthrough) forwards these events' bytes as the
upstream framed them; the translators read them decoded. Each event is decoded once, by
msgspec straight into the few fields the gateway reads (`ChatChunk`; the rest is skipped,
never built), which checks its shape and finds an in-band error, the finish and the
usage. Canonical framing (one `data:` line per event, lines ending in `\n`) is split with
bytes operations (gateway.providers.sse_blocks); any other event is re-rendered.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from model_gateway.gateway.providers.shapes import ChatChunk
from model_gateway.gateway.providers.sse_blocks import BlockSplitter, decode_event
from model_gateway.gateway.providers.upstream import reported_error
from model_gateway.pipeline.errors import GatewayError

_DECODE = msgspec.json.Decoder(ChatChunk).decode
_DONE = b"[DONE]"


class ChatEvent(NamedTuple):
    data: bytes  # the event's JSON
    block: bytes | None  # the event as framed upstream, blank line excluded; None: re-render
    chunk: ChatChunk


class ChatEvents:
    """Feed it the stream's reads; each gives the events it completed."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.done = False  # [DONE] came: what follows is read (the connection is reused) only
        self.finished = False  # a choice has its finish_reason
        self._blocks = BlockSplitter(provider)

    @property
    def complete(self) -> bool:
        return self.done or self.finished

    def feed(self, read: bytes) -> tuple[list[ChatEvent], GatewayError | None]:
        """The events `read` completes, up to the upstream's failure if one of them is one
        (then returned with the good events before it)."""
        events: list[ChatEvent] = []
        try:
            for name, data, block in self._blocks.feed(read):
                if data[:1] != b"{" and data.strip() == _DONE:
                    self.done = True
                    break
                # An `event:` field is not a chat stream's: such an event is re-rendered.
                events.append(self._event(data, None if name is not None else block))
        except GatewayError as failure:
            return events, failure
        return events, None

    def _event(self, data: bytes, block: bytes | None) -> ChatEvent:
        chunk, data, block = decode_event(_DECODE, data, block, self.provider)
        if chunk.error:  # in-band error from the upstream: never its text
            raise reported_error(self.provider)
        if not self.finished:
            self.finished = any(choice.finish_reason for choice in chunk.choices or ())
        return ChatEvent(data, block, chunk)
