"""What a client-facing stream looks like, one renderer per kind (see streaming.Renderer).

Each renderer also keeps what metering needs, and only that: the size of the output
delivered so far (`delivered`, which also stops the output at what the hold covers:
gateway.inference.output_limit) and the usage the upstream reported, as
{"input_tokens", "output_tokens"} (as reported: `usage` checks the counts when it bills
them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from model_gateway.gateway.inference.output_limit import (
    Delivered,
    delivered_chunk,
    past_the_limit,
    prefix_within,
    utf8_size,
)
from model_gateway.gateway.inference.responses_stream import Event, ResponsesEvents
from model_gateway.gateway.inference.sse import BLANK_LINE, DONE, data_event, named_event
from model_gateway.gateway.inference.tokens import text_of
from model_gateway.gateway.inference.usage import (
    CHAT_KEYS,
    RESPONSES_KEYS,
    Prompt,
    reported,
    shown_usage,
)
from model_gateway.gateway.providers.responses_events import RESPONSE_ENDS, ResponsesStreamEvent
from model_gateway.gateway.providers.sse_blocks import parse_checked
from model_gateway.pipeline.errors import GatewayError

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject


def chat_tokens(usage: Any) -> dict[str, Any]:
    """Chat usage's counts under the gateway's names, as reported (checked when billed)."""
    return reported(usage, CHAT_KEYS)


def responses_tokens(usage: Any) -> dict[str, Any]:
    """Responses usage's counts under the gateway's names, as reported."""
    return reported(usage, RESPONSES_KEYS)


def responses_error_event(error: GatewayError, request_id: str, sequence: int) -> bytes:
    """OpenAI's `error` event, carrying the gateway's error object too."""
    payload = {
        "type": "error",
        "sequence_number": sequence,
        "code": error.type,
        "message": error.message,
        "param": error.param,
        **error.body(request_id),
    }
    return named_event("error", payload)


class ChatStream:
    """What every client-facing chat stream shares: `data:` events, then `data: [DONE]`."""

    def __init__(
        self, model_id: str, include_usage: bool, prompt: Prompt, delivered: Delivered
    ) -> None:
        self.model_id = model_id
        self.include_usage = include_usage
        self.prompt = prompt
        self.delivered = delivered
        self._usage: Any = None

    def start(self) -> bytes:
        return b""

    def render(self, chunk: JSONObject) -> bytes:
        """A decoded chunk as the client gets it (b"" when it gets nothing of it)."""
        usage = chunk.get("usage")
        if usage and not self.delivered.covers(chat_tokens(usage).get("output_tokens")):
            self.delivered.cut_short(0)  # usage past the hold: not what the client is shown
            return b""
        chunk = delivered_chunk(self.delivered, chunk)
        if usage and not self.delivered.cut:
            # The usage chunk comes after the output: the gateway's count is final here.
            self._usage = usage
            chunk["usage"] = shown_usage(usage, self.prompt, self.delivered.size, CHAT_KEYS)
        if not self.include_usage or self.delivered.cut:
            chunk.pop("usage", None)  # as OpenAI: usage only for who asked for it
            if not chunk.get("choices"):
                return b""
        chunk["model"] = self.model_id
        return data_event(chunk)

    def finish(self) -> bytes:
        return DONE

    def error(self, error: GatewayError, request_id: str) -> bytes:
        return data_event(error.body(request_id))

    def usage(self) -> dict[str, Any]:
        return chat_tokens(self._usage)


class ChatRenderer(ChatStream):
    """Chat chunks from a provider that reads its upstream's stream (translating or not)."""

    def feed(self, chunk: JSONObject) -> bytes:
        return self.render(chunk)


class TranslatedResponsesRenderer:
    """Chat chunks translated into Responses events."""

    def __init__(self, request: JSONObject, prompt: Prompt, delivered: Delivered) -> None:
        self.events = ResponsesEvents(request)
        self.prompt = prompt
        self.delivered = delivered
        self._usage: Any = None  # as the upstream reported it

    @staticmethod
    def _write(events: Iterable[Event]) -> bytes:
        return b"".join(named_event(name, payload) for name, payload in events)

    def start(self) -> bytes:
        return self._write(self.events.start())

    def feed(self, chunk: JSONObject) -> bytes:
        # What the translation delivers: chat reasoning has no item (neither sent nor counted).
        chunk = delivered_chunk(self.delivered, chunk, reasoning=False)
        return self._write(self.events.feed(chunk))

    def finish(self) -> bytes:
        events = self.events
        if not self.delivered.covers(chat_tokens(events.usage).get("output_tokens")):
            self.delivered.cut_short(0)
            raise past_the_limit()
        self._usage = events.usage
        events.usage = shown_usage(events.usage, self.prompt, self.delivered.size, CHAT_KEYS)
        return self._write(events.finish())

    def error(self, error: GatewayError, request_id: str) -> bytes:
        return responses_error_event(error, request_id, self.events.sequence)

    def usage(self) -> dict[str, Any]:
        return chat_tokens(self._usage if self._usage is not None else self.events.usage)


_DELTAS = {  # every delta of output the client is sent
    "response.output_text.delta",
    "response.function_call_arguments.delta",
    "response.refusal.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
}


class NativeResponsesRenderer:
    """A native Responses stream passed through, with the gateway's model id."""

    def __init__(self, model_id: str, prompt: Prompt, delivered: Delivered) -> None:
        self.model_id = model_id
        self.prompt = prompt
        self.delivered = delivered
        self._usage: Any = None
        self._sequence = 0

    def start(self) -> bytes:
        return b""

    def feed(self, batch: list[ResponsesStreamEvent]) -> bytes:
        out: list[bytes] = []
        for name, data, block, event in batch:
            self._sequence = (event.sequence_number or self._sequence) + 1
            if name in _DELTAS and not self.delivered.take(utf8_size(text_of(event.delta))):
                out.append(self._cut(name, parse_checked(data)))
                break
            if block is not None and event.response is None:
                out += (block, BLANK_LINE)  # as it came: nothing in it is the gateway's
                continue
            rendered = self._rendered(name, parse_checked(data))
            if self.delivered.cut:
                break
            out.append(rendered)
        return b"".join(out)

    def _cut(self, name: str, payload: JSONObject) -> bytes:
        """The delta that crosses the held output, cut short (see output_limit)."""
        kept, _ = prefix_within(text_of(payload.get("delta")), self.delivered.room)
        self.delivered.cut_short(utf8_size(kept))
        payload["delta"] = kept
        return named_event(name, payload)

    def _rendered(self, name: str, payload: JSONObject) -> bytes:
        """An event with the response object: the gateway's model id, and the usage shown."""
        response = payload.get("response")
        if isinstance(response, dict):
            response["model"] = self.model_id
            if name in RESPONSE_ENDS and "usage" in response:  # the last event: the output is whole
                usage = response["usage"]
                if not self.delivered.covers(responses_tokens(usage).get("output_tokens")):
                    self.delivered.cut_short(0)  # not relayed: usage past the hold
                    return b""
                self._usage = usage
                response["usage"] = shown_usage(
                    usage, self.prompt, self.delivered.size, RESPONSES_KEYS
                )
        return named_event(name, payload)

    def finish(self) -> bytes:
        return b""

    def error(self, error: GatewayError, request_id: str) -> bytes:
        return responses_error_event(error, request_id, self._sequence)

    def usage(self) -> dict[str, Any]:
        return responses_tokens(self._usage)
