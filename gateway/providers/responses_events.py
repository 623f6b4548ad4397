"""A native Responses stream read as it arrives: one batch of whole, checked events per read.

Each event is decoded once, by msgspec straight into what the gateway reads
(`ResponsesEvent`: type, sequence number, text delta, the response object's shape), which
checks it. An `error` or `response.failed` event is the upstream's failure (never its
text). An event framed canonically with its `event:` line keeps its bytes
(gateway.providers.sse_blocks), so that the renderer can pass it through.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from model_gateway.gateway.providers.shapes import ResponsesEvent
from model_gateway.gateway.providers.sse_blocks import BlockSplitter, decode_event
from model_gateway.gateway.providers.upstream import reported_error
from model_gateway.pipeline.errors import GatewayError

_DECODE = msgspec.json.Decoder(ResponsesEvent).decode
_DONE = b"[DONE]"
RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete"})
_FAILED = frozenset({"response.failed", "error"})


class ResponsesStreamEvent(NamedTuple):
    name: str  # the `event:` field, else the data's type
    data: bytes  # the event's JSON
    block: bytes | None  # the event as framed upstream, blank line excluded; None: re-render
    event: ResponsesEvent


class NativeResponsesEvents:
    """Feed it the stream's reads; each gives the events it completed."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.done = False  # the response ended: what follows is read (connection reuse) only
        self._blocks = BlockSplitter(provider)

    @property
    def complete(self) -> bool:
        return self.done

    def feed(self, read: bytes) -> tuple[list[ResponsesStreamEvent], GatewayError | None]:
        """The events `read` completes, up to the upstream's failure if one of them is one
        (then returned with the good events before it)."""
        events: list[ResponsesStreamEvent] = []
        try:
            for name, data, block in self._blocks.feed(read):
                if self.done or (data[:1] != b"{" and data.strip() == _DONE):
                    continue
                events.append(self._event(name, data, block))
        except GatewayError as failure:
            return events, failure
        return events, None

    def _event(self, name: bytes | None, data: bytes, block: bytes | None) -> ResponsesStreamEvent:
        event, data, block = decode_event(_DECODE, data, block, self.provider)
        label = (name or b"").decode("utf-8", "replace") or event.type or ""
        if label in _FAILED:
            raise reported_error(self.provider)
        self.done = label in RESPONSE_ENDS
        # Without its `event:` line the client gets one: re-rendered.
        return ResponsesStreamEvent(label, data, block if name else None, event)
