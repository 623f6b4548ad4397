"""A chat stream rendered as a Messages stream, in Anthropic's order of events.

`message_start` (usage: none known yet), then per content block `content_block_start`,
its `content_block_delta`s (`text_delta`, or `input_json_delta` for a tool call's
arguments) and `content_block_stop`, then `message_delta` with the stop reason and the
WHOLE usage (input included: a chat stream reports it last), then `message_stop`. A
block ends when output of another kind (text, another tool call) begins; arguments that
come later for a tool call whose block ended go to its index. Every event is named
(`event:`): Anthropic's SDKs skip unnamed ones. A failure after the start is the
`error` event, in Anthropic's shape with the spec's error types.

Of the output only what the client is sent counts (chat reasoning has no block here),
stopped at what the hold covers (gateway.inference.output_limit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from model_gateway.gateway.inference.messages.messages_translate import (
    message_id,
    stop_reason,
    tool_use_id,
)
from model_gateway.gateway.inference.messages.messages_usage import (
    anthropic_usage,
    chat_cache_counts,
)
from model_gateway.gateway.inference.output_limit import (
    Delivered,
    delivered_chunk,
    past_the_limit,
)
from model_gateway.gateway.inference.renderers import chat_tokens
from model_gateway.gateway.inference.sse import named_event
from model_gateway.gateway.inference.tokens import content_text, text_of
from model_gateway.gateway.inference.usage import Prompt, billed_usage

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject
    from model_gateway.pipeline.errors import GatewayError


def messages_event(payload: JSONObject) -> bytes:
    """An event named by its type, as Anthropic sends every event."""
    return named_event(payload["type"], payload)


def error_event(error: GatewayError, request_id: str) -> bytes:
    """Anthropic's `error` event: {"type": "error", "error": the spec's error object}."""
    return messages_event({"type": "error", **error.body(request_id)})


class TranslatedMessagesRenderer:
    """Chat chunks (any provider's `chat_stream`) in, Messages events out."""

    def __init__(self, model: str, prompt: Prompt, delivered: Delivered) -> None:
        self.model = model
        self.prompt = prompt
        self.delivered = delivered
        self._blocks = 0  # content blocks started so far
        self._open: Any = None  # the open block: "text", a tool call's index, or None
        self._calls: dict[Any, int] = {}  # a chat tool call's index -> its block's index
        self._stop = "end_turn"
        self._usage: Any = None  # as the upstream reported it

    def start(self) -> bytes:
        message: JSONObject = {
            "id": message_id(),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return messages_event({"type": "message_start", "message": message})

    def feed(self, chunk: JSONObject) -> bytes:
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        chunk = delivered_chunk(self.delivered, chunk, reasoning=False)
        out: list[bytes] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = content_text(delta.get("content")) + text_of(delta.get("refusal"))
            if text:
                out += self._text(text)
            for call in delta.get("tool_calls") or ():
                out += self._tool_call(call)
            if choice.get("finish_reason"):
                self._stop = stop_reason(choice["finish_reason"])
        return b"".join(out)

    def _begin(self, which: Any, block: JSONObject) -> list[bytes]:
        """Close the open block, open a new one (`which` names it)."""
        out = self._close()
        self._open = which
        start = {"type": "content_block_start", "index": self._blocks, "content_block": block}
        self._blocks += 1
        return [*out, messages_event(start)]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [messages_event({"type": "content_block_stop", "index": self._blocks - 1})]

    @staticmethod
    def _delta(index: int, delta: JSONObject) -> bytes:
        return messages_event({"type": "content_block_delta", "index": index, "delta": delta})

    def _text(self, text: str) -> list[bytes]:
        out = [] if self._open == "text" else self._begin("text", {"type": "text", "text": ""})
        return [*out, self._delta(self._blocks - 1, {"type": "text_delta", "text": text})]

    def _tool_call(self, call: JSONObject) -> list[bytes]:
        which = call.get("index") if isinstance(call.get("index"), int) else 0
        function = call.get("function") or {}
        out: list[bytes] = []
        if which not in self._calls:
            block: JSONObject = {
                "type": "tool_use",
                "id": call.get("id") or tool_use_id(),
                "name": text_of(function.get("name")),
                "input": {},
            }
            out = self._begin(("tool", which), block)
            self._calls[which] = self._blocks - 1
        arguments = text_of(function.get("arguments"))
        if arguments:
            delta = {"type": "input_json_delta", "partial_json": arguments}
            out.append(self._delta(self._calls[which], delta))
        return out

    def finish(self) -> bytes:
        if not self.delivered.covers(chat_tokens(self._usage).get("output_tokens")):
            self.delivered.cut_short(0)
            raise past_the_limit()
        billed, _ = billed_usage(chat_tokens(self._usage), self.prompt, self.delivered.size)
        usage = anthropic_usage(billed, *chat_cache_counts(self._usage))
        delta = {"stop_reason": self._stop, "stop_sequence": None}
        end = {"type": "message_delta", "delta": delta, "usage": usage}
        return b"".join(
            [*self._close(), messages_event(end), messages_event({"type": "message_stop"})]
        )

    def error(self, error: GatewayError, request_id: str) -> bytes:
        return error_event(error, request_id)

    def usage(self) -> dict[str, Any]:
        return chat_tokens(self._usage)
