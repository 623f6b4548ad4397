"""An Anthropic Messages stream read as it arrives, for the pass-through of /v1/messages:
one batch of whole, checked events per read (and a whole answer's bytes, `NativeAnswer`).

Each event is decoded once, by msgspec straight into what the gateway reads of it
(`NativeEvent`: its type, the output a content block or delta carries, the model name
and the usage), which checks those fields' types; the rest is skipped. An `error` event
is the upstream's failure (never its text). An event framed canonically with its
`event:` line keeps its bytes (gateway.providers.sse_blocks), so that the renderer can
pass it through; one without (which the SDKs skip) is re-rendered with one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from model_gateway.gateway.providers.sse_blocks import BlockSplitter, decode_event
from model_gateway.gateway.providers.upstream import reported_error
from model_gateway.pipeline.errors import GatewayError

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

# The fields of a content block or a delta whose text is output delivered to the client
# (a redacted thinking block's `data` is read only when it is text: see `output_texts`).
OUTPUT_FIELDS = ("text", "partial_json", "thinking", "signature", "data")


class NativeOutput(msgspec.Struct, kw_only=True):
    """A content block (content_block_start) or a delta (content_block_delta)."""

    type: str | None = None
    text: str | None = None
    partial_json: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: Any = None


class NativeStart(msgspec.Struct, kw_only=True):
    """message_start's message: its model is renamed, its usage billed."""

    model: Any = None
    usage: Any = None


class NativeEvent(msgspec.Struct, kw_only=True):
    type: str | None = None
    message: NativeStart | None = None
    content_block: NativeOutput | None = None
    delta: NativeOutput | None = None
    usage: Any = None  # message_delta's (cumulative counts)


def output_texts(output: NativeOutput | None) -> list[str]:
    """The output texts a content block or a delta carries."""
    if output is None:
        return []
    values = (output.text, output.partial_json, output.thinking, output.signature, output.data)
    return [value for value in values if isinstance(value, str) and value]


class NativeAnswer(NamedTuple):
    """A whole Messages answer passed through: its bytes as they came, and decoded."""

    data: bytes
    message: JSONObject


class MessagesStreamEvent(NamedTuple):
    name: str  # the `event:` field, else the data's type
    data: bytes  # the event's JSON
    block: bytes | None  # the event as framed upstream, blank line excluded; None: re-render
    event: NativeEvent


_DECODE = msgspec.json.Decoder(NativeEvent).decode


class NativeMessagesEvents:
    """Feed it the stream's reads; each gives the events it completed."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.done = False  # message_stop came: what follows is read (connection reuse) only
        self._blocks = BlockSplitter(provider)

    @property
    def complete(self) -> bool:
        return self.done

    def feed(self, read: bytes) -> tuple[list[MessagesStreamEvent], GatewayError | None]:
        """The events `read` completes, up to the upstream's failure if one of them is one
        (then returned with the good events before it)."""
        events: list[MessagesStreamEvent] = []
        try:
            for name, data, block in self._blocks.feed(read):
                if not self.done:
                    events.append(self._event(name, data, block))
        except GatewayError as failure:
            return events, failure
        return events, None

    def _event(self, name: bytes | None, data: bytes, block: bytes | None) -> MessagesStreamEvent:
        event, data, block = decode_event(_DECODE, data, block, self.provider)
        label = (name or b"").decode("utf-8", "replace") or event.type or ""
        if label == "error" or event.type == "error":
            raise reported_error(self.provider)
        self.done = label == "message_stop"
        return MessagesStreamEvent(label, data, block if name else None, event)
