"""An upstream's SSE stream split into its events with bytes operations, for the readers
that forward events as the upstream framed them (gateway.providers.chat_events,
responses_events).

Canonical framing is one optional `event:` line and one `data:` line per event, lines
ending in `\n`: such an event comes out with its block (its bytes, blank line excluded).
Anything else (`\r` line ends, comments, several `data:` lines, other fields) goes
through the full SSE decoder and comes out without a block: its reader re-renders it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import msgspec
import orjson

from model_gateway.gateway.inference.sse import MAX_EVENT_BYTES, EventTooLarge, SSEDecoder
from model_gateway.gateway.providers.upstream import malformed

T = TypeVar("T")


class Block(NamedTuple):
    name: bytes | None  # the `event:` field, if any
    data: bytes  # the event's data (JSON, or [DONE])
    block: bytes | None  # the event as framed upstream; None: not canonical, re-render


class BlockSplitter:
    """Feed it the stream's reads; each gives the events it completed. An event over
    MAX_EVENT_BYTES is the provider's malformed answer."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self._buffer = b""
        self._decoder: SSEDecoder | None = None  # once the framing was not canonical

    def feed(self, read: bytes) -> list[Block]:
        try:
            return self._split(read)
        except EventTooLarge:
            raise malformed(self.provider) from None

    def _split(self, read: bytes) -> list[Block]:
        if self._decoder is None and b"\r" not in read:
            buffer = self._buffer + read if self._buffer else read
            end = buffer.rfind(b"\n\n")
            if end < 0:
                if len(buffer) > MAX_EVENT_BYTES:
                    raise EventTooLarge
                self._buffer = buffer
                return []
            self._buffer = buffer[end + 2 :]
            found: list[Block] = []
            for block in buffer[:end].split(b"\n\n"):
                canonical = _canonical(block)
                found += [canonical] if canonical else _decoded(SSEDecoder(), block + b"\n\n")
            return found
        if self._decoder is None:  # the stream's framing is not canonical: decode it all
            self._decoder, read, self._buffer = SSEDecoder(), self._buffer + read, b""
        return _decoded(self._decoder, read)


def _canonical(block: bytes) -> Block | None:
    name = None
    line = block
    if block[:6] == b"event:":
        head, _, line = block.partition(b"\n")
        name = head[7:] if head[6:7] == b" " else head[6:]
    if line[:5] != b"data:" or b"\n" in line:
        return None
    return Block(name, line[6:] if line[5:6] == b" " else line[5:], block)


def _decoded(decoder: SSEDecoder, read: bytes) -> list[Block]:
    return [
        Block(None if e.event is None else e.event.encode(), e.data.encode(), None)
        for e in decoder.feed(read)
    ]


_LENIENT = msgspec.json.Decoder(float_hook=float).decode


def parse_checked(data: bytes) -> Any:
    """A checked event's data as Python objects, as orjson reads it (an integer past 64
    bits as a float, so that it can be written again). A number orjson refuses, past a
    double's range, which msgspec's check passed, is read by msgspec as inf: nothing
    refuses an event after it went out."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _LENIENT(data)


def decode_event(
    decode: Callable[[bytes], T], data: bytes, block: bytes | None, provider: str
) -> tuple[T, bytes, bytes | None]:
    """The event's data decoded, with its data and block. Invalid UTF-8 is read as the SSE
    decoder reads it (U+FFFD), and such an event is re-rendered (no block); data that does
    not decode into its shape is the upstream's malformed answer."""
    try:
        return decode(data), data, block
    except RecursionError:  # nested past msgspec's limit
        raise malformed(provider) from None
    except (msgspec.DecodeError, UnicodeDecodeError):
        data = data.decode("utf-8", "replace").encode()
        try:
            return decode(data), data, None
        except (msgspec.DecodeError, RecursionError):
            raise malformed(provider) from None
