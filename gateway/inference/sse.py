"""Server-Sent Events: the one incremental parser (upstream streams) and the one writer."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

import orjson

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

DONE = b"data: [DONE]\n\n"
BLANK_LINE = b"\n\n"  # ends an event
_LINE_END = re.compile(rb"\r\n|\r|\n")
# The most an upstream's event (or a line of it) may hold before it ends: a delta is a
# few bytes, and a stream that never ends a line would otherwise grow the buffer, and
# the time spent rescanning it, without end.
MAX_EVENT_BYTES = 1 << 20


class EventTooLarge(ValueError):
    """An upstream event (or line) over MAX_EVENT_BYTES: the upstream's malformed answer."""


class Event(NamedTuple):
    event: str | None
    data: str


class SSEDecoder:
    """Bytes in, whole events out, whatever the chunking (WHATWG event-stream rules)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[str] = []
        self._size = 0  # bytes of the event's lines so far
        self._skip_lf = False  # the last chunk ended in \r: a leading \n ends no new line

    def feed(self, chunk: bytes) -> list[Event]:
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buffer = self._buffer + chunk
        events: list[Event] = []
        start = 0
        while (end := _LINE_END.search(buffer, start)) is not None:
            self._line(buffer[start : end.start()], events)
            start = end.end()
            self._skip_lf = end.group() == b"\r" and start == len(buffer)
        self._buffer = buffer[start:]
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise EventTooLarge
        return events

    def _line(self, line: bytes, events: list[Event]) -> None:
        if not line:
            if self._data:
                events.append(Event(self._event, "\n".join(self._data)))
            self._event, self._data, self._size = None, [], 0
            return
        self._size += len(line)
        if self._size > MAX_EVENT_BYTES:
            raise EventTooLarge
        if line.startswith(b":"):
            return  # a comment (keep-alive)
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value.decode("utf-8", "replace"))
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")


def data_event(payload: JSONObject) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def named_event(name: str, payload: JSONObject) -> bytes:
    return b"event: " + name.encode() + b"\n" + data_event(payload)
