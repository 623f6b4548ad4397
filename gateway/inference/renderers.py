"""What a client-facing stream looks like, one renderer per kind (see streaming.Renderer).

Each renderer also keeps what metering needs: the text delivered so far and the usage
the upstream reported, as {"input_tokens", "output_tokens"}.
"""

from __future__ import annotations

from gateway.errors import GatewayError
from gateway.inference.responses_stream import ResponsesEvents
from gateway.inference.sse import DONE, data_event, named_event


def chat_tokens(usage: dict | None) -> dict[str, int] | None:
    """Chat usage as the gateway's usage record."""
    if not usage:
        return None
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
    }


def responses_tokens(usage: dict | None) -> dict[str, int] | None:
    """Responses usage as the gateway's usage record."""
    if not usage:
        return None
    return {
        "input_tokens": int(usage.get("input_tokens") or 0),
        "output_tokens": int(usage.get("output_tokens") or 0),
    }


def chunk_output(chunk: dict) -> str:
    """The model output a chat chunk carries: text, refusal, tool names and arguments."""
    parts = []
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        parts.append(delta.get("content") or "")
        parts.append(delta.get("refusal") or "")
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            parts.append(function.get("name") or "")
            parts.append(function.get("arguments") or "")
    return "".join(parts)


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


class ChatRenderer:
    """Chat chunks as `data:` events, then `data: [DONE]`."""

    def __init__(self, model_id: str, include_usage: bool) -> None:
        self.model_id = model_id
        self.include_usage = include_usage
        self._output: list[str] = []
        self._usage: dict | None = None

    def start(self) -> bytes:
        return b""

    def feed(self, chunk: dict) -> bytes:
        usage = chunk.get("usage")
        if usage:
            self._usage = usage
        if not self.include_usage:
            chunk.pop("usage", None)  # as OpenAI: usage only for who asked for it
            if not chunk.get("choices"):
                return b""
        self._output.append(chunk_output(chunk))
        chunk["model"] = self.model_id
        return data_event(chunk)

    def finish(self) -> bytes:
        return DONE

    def error(self, error: GatewayError, request_id: str) -> bytes:
        return data_event(error.body(request_id))

    def output_text(self) -> str:
        return "".join(self._output)

    def usage(self) -> dict[str, int] | None:
        return chat_tokens(self._usage)


class TranslatedResponsesRenderer:
    """Chat chunks translated into Responses events."""

    def __init__(self, request: dict) -> None:
        self.events = ResponsesEvents(request)
        self._output: list[str] = []

    @staticmethod
    def _write(events) -> bytes:
        return b"".join(named_event(name, payload) for name, payload in events)

    def start(self) -> bytes:
        return self._write(self.events.start())

    def feed(self, chunk: dict) -> bytes:
        self._output.append(chunk_output(chunk))
        return self._write(self.events.feed(chunk))

    def finish(self) -> bytes:
        return self._write(self.events.finish())

    def error(self, error: GatewayError, request_id: str) -> bytes:
        return responses_error_event(error, request_id, self.events.sequence)

    def output_text(self) -> str:
        return "".join(self._output)

    def usage(self) -> dict[str, int] | None:
        return chat_tokens(self.events.usage)


_DELTAS = {
    "response.output_text.delta",
    "response.function_call_arguments.delta",
    "response.refusal.delta",
}
_ENDS = {"response.completed", "response.incomplete"}


class NativeResponsesRenderer:
    """A native Responses stream passed through, with the gateway's model id."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self._output: list[str] = []
        self._usage: dict | None = None
        self._sequence = 0

    def start(self) -> bytes:
        return b""

    def feed(self, event: tuple[str, dict]) -> bytes:
        name, payload = event
        self._sequence = int(payload.get("sequence_number") or self._sequence) + 1
        response = payload.get("response")
        if isinstance(response, dict):
            response["model"] = self.model_id
            if name in _ENDS:
                self._usage = response.get("usage")
        if name in _DELTAS:
            self._output.append(payload.get("delta") or "")
        return named_event(name, payload)

    def finish(self) -> bytes:
        return b""

    def error(self, error: GatewayError, request_id: str) -> bytes:
        return responses_error_event(error, request_id, self._sequence)

    def output_text(self) -> str:
        return "".join(self._output)

    def usage(self) -> dict[str, int] | None:
        return responses_tokens(self._usage)
