"""The six inbound APIs as one face, for the provider contract suite
(tests/providers/test_contract.py): Chat Completions, Responses and Messages, each plain
and streamed, driven by the official SDKs (openai's for the first two, anthropic's for
Messages), unchanged.

`Api.ask` puts one question to a model (optionally offering the get_weather tool, with
an output limit, or answering the tool calls of an earlier answer with their result)
and returns what the client saw, in a form the cases compare across APIs: an `Answer`,
or the `Failure` it met (an error answered before any output, or a stream's in-band
error). Each API also says how it shows a usage (`shown`) and its own words for why an
answer ended (`stops`); `raw_stream` asks for a stream with raw httpx, and
`in_band_error` reads the API's own in-band error event off its bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anthropic
import httpx
import openai
import orjson

from tests.support.inference import read_sse

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
MESSAGES_TOOL = {"name": "get_weather", "input_schema": SCHEMA}
MAX_TOKENS = 256  # what a Messages request asks when the case sets no limit (it must ask)


class Clients(NamedTuple):
    openai: openai.OpenAI
    anthropic: anthropic.Anthropic


class Usage(NamedTuple):
    """A usage in the gateway's convention: all input (cache reads and writes within it,
    the 1-hour writes within the writes), all output (reasoning within it)."""

    input: int
    output: int
    cache_reads: int = 0
    cache_writes: int = 0
    cache_writes_1h: int = 0
    reasoning: int = 0

    def receipt(self) -> dict[str, int]:
        """The usage a receipt shows (decisions.md, "Prices, exactly"): every class, the
        1-hour cache writes only when there are some."""
        classes = {
            "input_tokens": self.input,
            "cached_input_tokens": self.cache_reads,
            "cache_write_tokens": self.cache_writes,
            "output_tokens": self.output,
            "reasoning_tokens": self.reasoning,
        }
        if self.cache_writes_1h:
            classes["cache_write_1h_tokens"] = self.cache_writes_1h
        return classes


@dataclass
class Call:
    id: str
    name: str
    arguments: dict


@dataclass
class Answer:
    model: str  # the model the answer names (every chunk's, for a chat stream)
    text: str
    pieces: int  # text deltas of a stream; 1 for a whole answer
    stop: str  # the API's own word for why it ended
    usage: dict[str, int]  # the counts as the API shows them (see Api.shown)
    headers: Mapping[str, str]
    calls: list[Call] = field(default_factory=list)
    turn: Any = None  # the assistant's turn, as the API's next request carries it


@dataclass
class Failure:
    status: int  # 200: the error came in band, after the stream started
    error: dict  # the error object
    headers: Mapping[str, str]
    body: str  # the whole error body, or the in-band error object (as JSON)
    text: str = ""  # the text delivered before an in-band error
    response: Any = None  # the HTTP response of an error answered before any output


def _refused(error: openai.APIStatusError | anthropic.APIStatusError) -> Failure:
    response = error.response
    return Failure(
        response.status_code,
        response.json()["error"],
        response.headers,
        response.text,
        response=response,
    )


class Api:
    """One inbound API, plain or streamed."""

    family = ""
    path = ""
    stops: Mapping[str, str] = {}

    def __init__(self, stream: bool) -> None:
        self.stream = stream

    def __repr__(self) -> str:
        return f"{self.family}-{'stream' if self.stream else 'plain'}"

    def shown(self, usage: Usage) -> dict[str, int]:
        raise NotImplementedError

    def ask(
        self,
        clients: Clients,
        model: str,
        prompt: str,
        *,
        tools: bool = False,
        limit: int | None = None,
        after: tuple[Answer, str] | None = None,
    ) -> Answer | Failure:
        """Ask `prompt`; `after`: an earlier answer's tool calls and their result."""
        raise NotImplementedError

    def stream_body(self, model: str, prompt: str) -> dict:
        raise NotImplementedError

    def raw_stream(self, http: httpx.Client, model: str, prompt: str) -> httpx.Response:
        return http.post(self.path, json=self.stream_body(model, prompt))

    def in_band_error(self, events: list[tuple[str | None, dict | str]]) -> dict:
        """The error object of the stream's in-band error, which must be its last event
        and in the API's own form; `events` are (event name, JSON payload or [DONE])."""
        raise NotImplementedError


def sse_events(raw: bytes) -> list[tuple[str | None, dict | str]]:
    """A whole SSE body's events: (name, payload), `[DONE]` kept as the string."""
    return [
        (name, data if data == "[DONE]" else orjson.loads(data)) for name, data in read_sse(raw)
    ]


class Chat(Api):
    family = "chat"
    path = "/v1/chat/completions"
    stops = {"normal": "stop", "length": "length", "tool": "tool_calls"}

    def shown(self, usage: Usage) -> dict[str, int]:
        return {
            "prompt_tokens": usage.input,
            "completion_tokens": usage.output,
            "cached_tokens": usage.cache_reads,
            "reasoning_tokens": usage.reasoning,
        }

    def stream_body(self, model: str, prompt: str) -> dict:
        return {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True}

    def in_band_error(self, events):
        # A data-only `{"error": {...}}`, then the end: no [DONE].
        name, payload = events[-1]
        assert name is None and isinstance(payload, dict) and list(payload) == ["error"], payload
        assert "[DONE]" not in [data for _, data in events]
        return payload["error"]

    @staticmethod
    def _counts(usage: Any) -> dict[str, int]:
        details, output = usage.prompt_tokens_details, usage.completion_tokens_details
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": (details and details.cached_tokens) or 0,
            "reasoning_tokens": (output and output.reasoning_tokens) or 0,
        }

    def ask(self, clients, model, prompt, *, tools=False, limit=None, after=None):
        messages: list[dict] = [{"role": "user", "content": prompt}]
        if after is not None:
            answer, result = after
            messages.append(answer.turn)
            messages += [
                {"role": "tool", "tool_call_id": call.id, "content": result}
                for call in answer.calls
            ]
        asked: dict[str, Any] = {"model": model, "messages": messages}
        if tools:
            asked |= {"tools": [CHAT_TOOL], "tool_choice": "auto" if after else "required"}
        if limit is not None:
            asked["max_completion_tokens"] = limit
        create = clients.openai.chat.completions.with_raw_response.create
        try:
            if self.stream:
                options = {"include_usage": True}
                raw = create(**asked, stream=True, stream_options=options)
            else:
                raw = create(**asked)
        except openai.APIStatusError as error:
            return _refused(error)
        if not self.stream:
            done = raw.parse()
            message = done.choices[0].message
            calls = [
                Call(c.id, c.function.name, json.loads(c.function.arguments))
                for c in message.tool_calls or ()
            ]
            return Answer(
                done.model,
                message.content or "",
                1,
                done.choices[0].finish_reason,
                self._counts(done.usage),
                raw.headers,
                calls,
                message.model_dump(exclude_none=True),
            )
        pieces: list[str] = []
        models: set[str] = set()
        finishes: list[str] = []
        calls_by_index: dict[int, dict] = {}
        chunk = None
        try:
            for chunk in raw.parse():
                models.add(chunk.model)
                for choice in chunk.choices:
                    if choice.delta.content:
                        pieces.append(choice.delta.content)
                    if choice.finish_reason:
                        finishes.append(choice.finish_reason)
                    for part in choice.delta.tool_calls or ():
                        _merge_call(calls_by_index, part.model_dump(exclude_none=True))
        except openai.APIError as error:
            return _in_band(error.body, raw.headers, "".join(pieces))
        assert len(finishes) == 1, finishes
        # include_usage: the last chunk, and it alone, holds the usage and no choice.
        assert chunk is not None and chunk.choices == [] and chunk.usage, chunk
        usage = chunk.usage
        tool_calls = [calls_by_index[i] for i in sorted(calls_by_index)]
        turn: dict[str, Any] = {"role": "assistant", "content": "".join(pieces) or None}
        if tool_calls:
            turn["tool_calls"] = tool_calls
        calls = [
            Call(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in tool_calls
        ]
        return Answer(
            ",".join(sorted(models)),
            "".join(pieces),
            len(pieces),
            finishes[0],
            self._counts(usage),
            raw.headers,
            calls,
            turn,
        )


def _merge_call(calls: dict[int, dict], part: dict) -> None:
    """Add a streamed tool call's delta to the call it continues (by index): the name
    and arguments are concatenated, anything else (id, type, a vendor's extra) kept."""
    call = calls.setdefault(part.pop("index"), {"function": {"name": "", "arguments": ""}})
    for key, value in part.pop("function", {}).items():
        call["function"][key] = call["function"].get(key, "") + (value or "")
    call.update(part)


def _in_band(error: Any, headers: Mapping[str, str], text: str) -> Failure:
    assert isinstance(error, dict), error
    return Failure(200, error, headers, json.dumps(error), text)


class Responses(Api):
    family = "responses"
    path = "/v1/responses"
    stops = {
        "normal": "completed",
        "length": "incomplete/max_output_tokens",
        "tool": "completed",
    }

    def shown(self, usage: Usage) -> dict[str, int]:
        return {
            "input_tokens": usage.input,
            "output_tokens": usage.output,
            "cached_tokens": usage.cache_reads,
            "reasoning_tokens": usage.reasoning,
        }

    def stream_body(self, model: str, prompt: str) -> dict:
        return {"model": model, "input": prompt, "stream": True}

    def in_band_error(self, events):
        # OpenAI's `event: error`, with the gateway's error object beside its fields.
        name, payload = events[-1]
        assert name == "error" and isinstance(payload, dict), (name, payload)
        assert payload["type"] == "error", payload
        return payload["error"]

    def ask(self, clients, model, prompt, *, tools=False, limit=None, after=None):
        items: str | list[dict] = prompt
        if after is not None:
            answer, result = after
            items = [
                {"role": "user", "content": prompt},
                *answer.turn,
                *(
                    {"type": "function_call_output", "call_id": call.id, "output": result}
                    for call in answer.calls
                ),
            ]
        asked: dict[str, Any] = {"model": model, "input": items}
        if tools:
            asked |= {"tools": [RESPONSES_TOOL], "tool_choice": "auto" if after else "required"}
        if limit is not None:
            asked["max_output_tokens"] = limit
        create = clients.openai.responses.with_raw_response.create
        try:
            raw = create(**asked, stream=True) if self.stream else create(**asked)
        except openai.APIStatusError as error:
            return _refused(error)
        pieces = []
        if self.stream:
            final = None
            sequence = []
            try:
                for event in raw.parse():
                    sequence.append(event.sequence_number)
                    if event.type == "response.output_text.delta":
                        pieces.append(event.delta)
                    if event.type in ("response.completed", "response.incomplete"):
                        final = event.response
            except openai.APIError as error:
                return _in_band(error.body, raw.headers, "".join(pieces))
            assert final is not None, "the stream ended without its response"
            assert sequence == list(range(len(sequence))), sequence
            assert "".join(pieces) == final.output_text
        else:
            final = raw.parse()
            pieces = [final.output_text]
        stop = final.status
        if final.incomplete_details is not None:
            stop += f"/{final.incomplete_details.reason}"
        calls = [item for item in final.output if item.type == "function_call"]
        details, output = final.usage.input_tokens_details, final.usage.output_tokens_details
        return Answer(
            final.model,
            final.output_text,
            len(pieces),
            stop,
            {
                "input_tokens": final.usage.input_tokens,
                "output_tokens": final.usage.output_tokens,
                "cached_tokens": (details and details.cached_tokens) or 0,
                "reasoning_tokens": (output and output.reasoning_tokens) or 0,
            },
            raw.headers,
            [Call(item.call_id, item.name, json.loads(item.arguments)) for item in calls],
            [item.model_dump(exclude_none=True) for item in calls],
        )


class Messages(Api):
    family = "messages"
    path = "/v1/messages"
    stops = {"normal": "end_turn", "length": "max_tokens", "tool": "tool_use"}

    def shown(self, usage: Usage) -> dict[str, int]:
        # Anthropic's convention: input_tokens without the cache's reads and writes.
        return {
            "input_tokens": usage.input - usage.cache_reads - usage.cache_writes,
            "output_tokens": usage.output,
            "cache_read_input_tokens": usage.cache_reads,
            "cache_creation_input_tokens": usage.cache_writes,
        }

    def stream_body(self, model: str, prompt: str) -> dict:
        messages = [{"role": "user", "content": prompt}]
        return {"model": model, "max_tokens": MAX_TOKENS, "messages": messages, "stream": True}

    def in_band_error(self, events):
        # Anthropic's `event: error` with {"type": "error", "error": {type, message,
        # request_id}} (the spec's error types).
        name, payload = events[-1]
        assert name == "error" and isinstance(payload, dict), (name, payload)
        assert list(payload) == ["type", "error"] and payload["type"] == "error", payload
        assert set(payload["error"]) == {"type", "message", "request_id"}, payload
        return payload["error"]

    def ask(self, clients, model, prompt, *, tools=False, limit=None, after=None):
        messages: list[dict] = [{"role": "user", "content": prompt}]
        if after is not None:
            answer, result = after
            results = [
                {"type": "tool_result", "tool_use_id": call.id, "content": result}
                for call in answer.calls
            ]
            messages += [
                {"role": "assistant", "content": answer.turn},
                {"role": "user", "content": results},
            ]
        asked: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": MAX_TOKENS if limit is None else limit,
        }
        if tools:
            choice = {"type": "auto" if after else "any"}
            asked |= {"tools": [MESSAGES_TOOL], "tool_choice": choice}
        pieces: list[str] = []
        try:
            if self.stream:
                with clients.anthropic.messages.stream(**asked) as stream:
                    headers = stream.response.headers
                    for piece in stream.text_stream:
                        pieces.append(piece)
                    message = stream.get_final_message()
            else:
                raw = clients.anthropic.messages.with_raw_response.create(**asked)
                headers, message = raw.headers, raw.parse()
        except anthropic.APIStatusError as error:
            if error.status_code != 200:
                return _refused(error)
            # An `event: error` after the stream started (the SDK raises on that event
            # only): Anthropic's {"type": "error", "error": {...}}.
            assert error.body["type"] == "error", error.body
            return _in_band(error.body["error"], error.response.headers, "".join(pieces))
        text = "".join(block.text for block in message.content if block.type == "text")
        uses = [block for block in message.content if block.type == "tool_use"]
        usage = message.usage
        return Answer(
            message.model,
            text,
            len(pieces) if self.stream else 1,
            message.stop_reason,
            {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_read_input_tokens": usage.cache_read_input_tokens or 0,
                "cache_creation_input_tokens": usage.cache_creation_input_tokens or 0,
            },
            headers,
            [Call(use.id, use.name, use.input) for use in uses],
            [block.model_dump(exclude_none=True) for block in message.content],
        )


APIS = [api(stream) for api in (Chat, Responses, Messages) for stream in (False, True)]
