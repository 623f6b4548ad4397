"""Any OpenAI-compatible server: OpenAI, vLLM, Ollama, llama.cpp, OpenRouter...

Chat Completions pass through as they are, streams included (read by `chat_events`),
and so do Embeddings (asked for float vectors). Streams always ask the upstream for
usage (`stream_options.include_usage`). The Responses endpoint is used when the
upstream has one; a server answering 404/405/501 there is served by translation instead
(the handlers remember that once translation has worked).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Annotated

import msgspec

from model_gateway.gateway.providers.chat_events import ChatEvent, ChatEvents
from model_gateway.gateway.providers.responses_events import (
    NativeResponsesEvents,
    ResponsesStreamEvent,
)
from model_gateway.gateway.providers.shapes import (
    ChatAnswer,
    ResponsesAnswer,
    checked,
)
from model_gateway.gateway.providers.sse_blocks import parse_checked
from model_gateway.gateway.providers.upstream import (
    Acceptance,
    HttpProvider,
)

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

_FLOAT32_MAX = 3.4028234663852886e38
# What the gateway reads of an embeddings answer (its usage is judged count by count):
# float32 values, as the gateway's base64 form packs them.
_Value = Annotated[float, msgspec.Meta(ge=-_FLOAT32_MAX, le=_FLOAT32_MAX)]


class _Embedding(msgspec.Struct):
    index: int
    embedding: list[_Value]


class _EmbeddingsAnswer(msgspec.Struct):
    data: list[_Embedding]


class OpenAIProvider(HttpProvider):
    kind = "openai"
    chat_pass_through = True
    native_responses: bool | None = None

    def headers(self) -> dict[str, str]:
        credential = self.config.credential()
        return {"authorization": f"Bearer {credential}"} if credential else {}

    def path(self, operation: str, model: str) -> str:
        """The path of an operation ("chat/completions", "responses", "embeddings")."""
        return "/" + operation

    async def chat(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        path = self.path("chat/completions", request["model"])
        answer = await self.post_json(path, request, acceptance)
        return checked(self.name, answer, ChatAnswer)

    async def chat_events(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[list[ChatEvent]]:
        options = {**(request.get("stream_options") or {}), "include_usage": True}
        body = {**request, "stream": True, "stream_options": options}
        reads = self.post_stream(self.path("chat/completions", request["model"]), body, acceptance)
        async for batch in self.batches(reads, ChatEvents(self.name)):
            yield batch

    async def chat_stream(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[JSONObject]:
        batches = self.chat_events(request, acceptance)
        async with contextlib.aclosing(batches):
            async for batch in batches:
                for event in batch:
                    yield parse_checked(event.data)  # the parser that checked it

    async def responses(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        path = self.path("responses", request["model"])
        answer = await self.post_json(path, request, acceptance, optional_endpoint=True)
        return checked(self.name, answer, ResponsesAnswer)

    async def responses_stream(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[list[ResponsesStreamEvent]]:
        body = {**request, "stream": True}
        path = self.path("responses", request["model"])
        reads = self.post_stream(path, body, acceptance, optional_endpoint=True)
        async for batch in self.batches(reads, NativeResponsesEvents(self.name)):
            yield batch

    async def embeddings(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        body = {**request, "encoding_format": "float"}  # base64 is the gateway's own work
        answer = await self.post_json(self.path("embeddings", request["model"]), body, acceptance)
        return checked(self.name, answer, _EmbeddingsAnswer)
