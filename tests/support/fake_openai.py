"""A fake OpenAI-compatible upstream (see fake_upstream for its fault modes).

`{url}/v1` has Chat Completions, Responses and Embeddings; `{url}/chatonly/v1` has Chat
Completions only (its /responses answers 404), like many OpenAI-compatible servers.

Embeddings: input `i` is embedded as `fake_embedding(i, dimensions)` (FAKE_DIMENSIONS
values unless the request names `dimensions`), in floats or, asked for, in base64 as
OpenAI encodes it; usage INPUT_TOKENS. Texts and token-id lists are taken, as OpenAI
does; other inputs are 400. Besides the common modes: `reversed-order` answers the
vectors last first (each with its right index), `wrong-count` one vector short.
"""

from __future__ import annotations

import base64
import struct
import time

from aiohttp import web

from model_gateway.gateway.metering.pricing import held_output_tokens
from tests.support.fake_upstream import (
    INPUT_TOKENS,
    MALFORMED,
    OUTPUT_TOKENS,
    REPLY_PIECES,
    FakeUpstream,
    sse,
    usage_for,
)

TOOL_ARGUMENTS = ['{"city":', ' "Paris"}']


# `cached`: of the INPUT_TOKENS, these are cache reads; of the output, these reasoning.
CACHED_READS, REASONING = 4, 3
CACHED = "cached"


def _chat_usage(model: str, body: dict) -> dict:
    output = OUTPUT_TOKENS
    if model == AT_THE_HOLD:
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        output = held_output_tokens(limit, limit)
    usage = {
        "prompt_tokens": INPUT_TOKENS,
        "completion_tokens": output,
        "total_tokens": INPUT_TOKENS + output,
    }
    if model == CACHED:
        usage["prompt_tokens_details"] = {"cached_tokens": CACHED_READS}
        usage["completion_tokens_details"] = {"reasoning_tokens": REASONING}
    return usage_for(model, usage)


FAKE_DIMENSIONS = 3  # a vector's length when the request names none
REVERSED, WRONG_COUNT = "reversed-order", "wrong-count"  # embeddings modes


def fake_embedding(index: int, dimensions: int) -> list[float]:
    """The vector of input `index` (values float32 holds exactly, as base64 carries them)."""
    return [index + 0.5] + [0.25] * (dimensions - 1)


def _embedding_inputs(value) -> list | None:
    """The inputs of an embeddings request as OpenAI reads `input`; None when invalid."""
    if isinstance(value, str) and value:
        return [value]
    if not isinstance(value, list) or not value:
        return None
    if all(type(token) is int for token in value):
        return [value]
    texts = all(isinstance(item, str) and item for item in value)
    token_lists = all(
        isinstance(item, list) and item and all(type(token) is int for token in item)
        for item in value
    )
    return value if texts or token_lists else None


# Chat stream modes of this fake only (see fake_upstream's table).
REASONING_CUT = "reasoning-cut-mid-stream"  # the text as `reasoning_content`, then cut
PARTS = "parts-no-usage"  # the text as content parts, no usage
HUGE_NUMBER = "huge-number"  # every chunk also carries 1e400, beyond a double; no usage
HUGE_ANSWER = "huge-answer"  # a whole answer of 17 MiB
REFUSAL = "refusal"  # the text as the model's refusal (`refusal`, no content)
WHOLE_PARTS = "parts-whole-answer"  # a whole answer's text as content parts; streams: normal
# Reports as its output every token the gateway holds for the request's limit, no more:
# a request then costs exactly its hold (tests that count what money covers).
AT_THE_HOLD = "at-the-hold"
NO_USAGE = {"no-usage", PARTS, HUGE_NUMBER}
OPENAI_MODES = [REASONING_CUT, PARTS, HUGE_NUMBER, HUGE_ANSWER, REFUSAL]


def _delta(model: str, piece: str) -> dict | str:
    if model == MALFORMED:
        return "not a delta"
    if model == REASONING_CUT:
        return {"reasoning_content": piece}
    if model == PARTS:
        return {"content": [{"type": "text", "text": piece}]}
    if model == REFUSAL:
        return {"refusal": piece}
    return {"content": piece}


def _reply(body: dict) -> tuple[list[str], str, dict | None]:
    """(text pieces, finish_reason, tool call) the fake answers `body` with."""
    model = body["model"]
    last = body["messages"][-1]
    if last.get("role") == "tool":
        return [f"The tool said: {last.get('content')}"], "stop", None
    if model == "tool-call" and body.get("tools"):
        name = body["tools"][0]["function"]["name"]
        call = {"id": "call_fake1", "type": "function", "function": {"name": name}}
        return [], "tool_calls", call
    if model == "length":
        return REPLY_PIECES[:2], "length", None
    return REPLY_PIECES, "stop", None


def _responses_reply(body: dict) -> tuple[list[str], dict | None, str | None]:
    """(text pieces, function call, why incomplete) the fake answers a Responses `body`
    with: as _reply, in Responses' items."""
    items = body.get("input")
    last = items[-1] if isinstance(items, list) and items else {}
    if last.get("type") == "function_call_output":
        return [f"The tool said: {last.get('output')}"], None, None
    if body["model"] == "tool-call" and body.get("tools"):
        call = {
            "type": "function_call",
            "id": "fc_fake1",
            "call_id": "call_fake1",
            "name": body["tools"][0]["name"],
            "arguments": "".join(TOOL_ARGUMENTS),
            "status": "completed",
        }
        return [], call, None
    if body["model"] == "length":
        return REPLY_PIECES[:2], None, "max_output_tokens"
    return REPLY_PIECES, None, None


class FakeOpenAI(FakeUpstream):
    def __init__(self, credential: str) -> None:
        super().__init__()
        self.credential = credential

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self.chat),
            web.post("/chatonly/v1/chat/completions", self.chat),
            web.post("/v1/responses", self.responses),
            web.post("/v1/embeddings", self.embeddings),
            web.post("/stolen", self.stolen),
        ]

    def provider_config(self, name: str) -> tuple[str, dict[str, str]]:
        """The `[providers.NAME]` block pointing at this fake, and its credential's variable."""
        block = f"""
[providers."{name}"]
kind = "openai"
base_url = "{self.url}/v1"
api_key_env = "FAKE_OPENAI_KEY"
"""
        return block, {"FAKE_OPENAI_KEY": self.credential}

    async def _admit(self, request: web.Request) -> tuple[dict, web.StreamResponse | None]:
        body = await self.record(request)
        if request.headers.get("authorization") != f"Bearer {self.credential}":
            error = {"message": "Incorrect API key provided", "type": "invalid_request_error"}
            return body, web.json_response({"error": error}, status=401)
        return body, await self.before_answer(request, body["model"])

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body, early = await self._admit(request)
        if early is not None:
            return early
        model = body["model"]
        pieces, finish, call = _reply(body)
        if call is not None:
            call = {**call, "function": {**call["function"], "arguments": "".join(TOOL_ARGUMENTS)}}
        if not body.get("stream"):
            if model == HUGE_ANSWER:
                pieces = ["a" * (17 << 20)]
            message = {"role": "assistant", "content": "".join(pieces) or None}
            if model == REFUSAL:
                message = {"role": "assistant", "content": None, "refusal": "".join(pieces)}
            if model == WHOLE_PARTS:
                message["content"] = [{"type": "text", "text": "".join(pieces)}]
            if call:
                message["tool_calls"] = [call]
            payload = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": "not a message" if model == MALFORMED else message,
                        "finish_reason": finish,
                    }
                ],
            }
            if model not in NO_USAGE:
                payload["usage"] = _chat_usage(model, body)
            return await self.answer(request, model, payload)
        include_usage = (body.get("stream_options") or {}).get("include_usage")

        def chunk(delta: dict | str, finish_reason: str | None = None) -> bytes:
            payload = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            if include_usage:
                payload["usage"] = None
            if model == HUGE_NUMBER:
                return sse({**payload, "x": 0}).replace(b'"x":0', b'"x":1e400')
            return sse(payload)

        events = [chunk({"role": "assistant", "content": ""})]
        if call:
            start = {**call, "index": 0, "function": {**call["function"], "arguments": ""}}
            events.append(chunk({"tool_calls": [start]}))
            for part in TOOL_ARGUMENTS:
                events.append(
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
                )
        for piece in pieces:
            events.append(chunk(_delta(model, piece)))
        events.append(chunk({}, finish))
        if include_usage and model not in NO_USAGE:
            usage = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model}
            events.append(sse({**usage, "choices": [], "usage": _chat_usage(model, body)}))
        events.append(b"data: [DONE]\n\n")
        return await self.stream(request, model, events, text_from=1)

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body, early = await self._admit(request)
        if early is not None:
            return early
        model = body["model"]
        inputs = _embedding_inputs(body.get("input"))
        if inputs is None:
            error = {"message": "Invalid input", "type": "invalid_request_error", "param": "input"}
            return web.json_response({"error": error}, status=400)
        dimensions = body.get("dimensions", FAKE_DIMENSIONS)
        data = []
        for i in range(len(inputs)):
            vector = fake_embedding(i, dimensions)
            if body.get("encoding_format") == "base64":
                vector = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vector})
        if model == MALFORMED:
            data[0]["embedding"] = {"not": "a vector"}
        if model == REVERSED:
            data.reverse()
        if model == WRONG_COUNT:
            data.pop()
        payload = {"object": "list", "data": data, "model": model}
        if model not in NO_USAGE:
            usage = {"prompt_tokens": INPUT_TOKENS, "total_tokens": INPUT_TOKENS}
            payload["usage"] = usage_for(model, usage)
        return await self.answer(request, model, payload)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body, early = await self._admit(request)
        if early is not None:
            return early
        model = body["model"]
        pieces, call, incomplete = _responses_reply(body)
        text = "".join(pieces)
        cached = model == CACHED
        usage = {
            "input_tokens": INPUT_TOKENS,
            "input_tokens_details": {"cached_tokens": CACHED_READS if cached else 0},
            "output_tokens": OUTPUT_TOKENS,
            "output_tokens_details": {"reasoning_tokens": REASONING if cached else 0},
            "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
        }
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {
            "type": "message",
            "id": "msg_fake",
            "status": "completed",
            "role": "assistant",
            "content": [part],
        }
        output = ([item] if pieces else []) + ([call] if call else [])
        response = {
            "id": "resp_fake",
            "object": "response",
            "created_at": int(time.time()),
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "model": model,
            "output": ["not an item"] if model == MALFORMED else output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": None if model == "no-usage" else usage_for(model, usage),
        }
        if not body.get("stream"):
            return await self.answer(request, model, response)
        sequence = iter(range(1000))

        def event(name: str, **fields) -> bytes:
            return sse({"type": name, "sequence_number": next(sequence), **fields}, event=name)

        started = {**response, "status": "in_progress", "output": [], "usage": None}
        events = [
            event("response.created", response=started),
            event("response.in_progress", response=started),
        ]
        if pieces:
            common = {"item_id": "msg_fake", "output_index": 0, "content_index": 0}
            events += [
                event(
                    "response.output_item.added",
                    output_index=0,
                    item={**item, "status": "in_progress", "content": []},
                ),
                event("response.content_part.added", **common, part={**part, "text": ""}),
                *[
                    event(
                        "response.output_text.delta",
                        **common,
                        delta=piece,
                        logprobs=[],
                        **({"response": "x"} if model == MALFORMED else {}),
                    )
                    for piece in pieces
                ],
                event("response.output_text.done", **common, text=text, logprobs=[]),
                event("response.content_part.done", **common, part=part),
                event("response.output_item.done", output_index=0, item=item),
            ]
        if call:
            at = {"item_id": call["id"], "output_index": len(output) - 1}
            added = {**call, "status": "in_progress", "arguments": ""}
            events += [
                event("response.output_item.added", output_index=at["output_index"], item=added),
                *[
                    event("response.function_call_arguments.delta", **at, delta=part)
                    for part in TOOL_ARGUMENTS
                ],
                event("response.function_call_arguments.done", **at, arguments=call["arguments"]),
                event("response.output_item.done", output_index=at["output_index"], item=call),
            ]
        end = "response.incomplete" if incomplete else "response.completed"
        events.append(event(end, response=response))
        return await self.stream(request, model, events, text_from=4)
