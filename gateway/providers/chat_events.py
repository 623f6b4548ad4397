"""An OpenAI chat stream read as it arrives: one batch of whole, checked events per read.

The pass-through (gateway.inference.passthrough) forwards these events' bytes as the
upstream framed them; the translators read them decoded. Each event is decoded once, by
msgspec straight into the few fields the gateway reads (`ChatChunk`; the rest is skipped,
never built), which checks its shape and finds an in-band error, the finish and the
usage. Canonical framing (one `data:` line per event, lines ending in `\n`) is split with
bytes operations; anything else (`\r` line ends, comments, several `data:` lines, `event:`
fields) goes through the full SSE decoder, and such an event is re-rendered.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from model_gateway.gateway.inference.sse import SSEDecoder
from model_gateway.gateway.providers.shapes import ChatChunk
from model_gateway.gateway.providers.upstream import malformed, reported_error
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
        self._buffer = b""
        self._decoder: SSEDecoder | None = None  # once the framing was not canonical

    @property
    def complete(self) -> bool:
        return self.done or self.finished

    def feed(self, read: bytes) -> tuple[list[ChatEvent], GatewayError | None]:
        """The events `read` completes, up to the upstream's failure if one of them is one
        (then returned with the good events before it)."""
        events: list[ChatEvent] = []
        try:
            for data, block in self._split(read):
                if data[:1] != b"{" and data.strip() == _DONE:
                    self.done = True
                    break
                events.append(self._event(data, block))
        except GatewayError as failure:
            return events, failure
        return events, None

    def _split(self, read: bytes) -> list[tuple[bytes, bytes | None]]:
        """(data, block) of each event `read` completes."""
        if self._decoder is None and b"\r" not in read:
            buffer = self._buffer + read if self._buffer else read
            end = buffer.rfind(b"\n\n")
            if end < 0:
                self._buffer = buffer
                return []
            self._buffer = buffer[end + 2 :]
            found: list[tuple[bytes, bytes | None]] = []
            for block in buffer[:end].split(b"\n\n"):
                if block[:5] == b"data:" and b"\n" not in block:
                    data = block[6:] if block[5:6] == b" " else block[5:]
                    found.append((data, block))
                else:  # a comment, a field other than data, or a stray line end
                    found += [(e.data.encode(), None) for e in SSEDecoder().feed(block + b"\n\n")]
            return found
        if self._decoder is None:  # the stream's framing is not canonical: decode it all
            self._decoder, read, self._buffer = SSEDecoder(), self._buffer + read, b""
        return [(e.data.encode(), None) for e in self._decoder.feed(read)]

    def _event(self, data: bytes, block: bytes | None) -> ChatEvent:
        try:
            chunk = _DECODE(data)
        except (msgspec.DecodeError, UnicodeDecodeError):
            # The SSE decoder reads invalid UTF-8 as U+FFFD: so does this, re-rendered.
            data, block = data.decode("utf-8", "replace").encode(), None
            try:
                chunk = _DECODE(data)
            except msgspec.DecodeError:
                raise malformed(self.provider) from None
        if chunk.error:  # in-band error from the upstream: never its text
            raise reported_error(self.provider)
        if not self.finished:
            self.finished = any(choice.finish_reason for choice in chunk.choices or ())
        return ChatEvent(data, block, chunk)
