"""Google's Gemini API (`kind = "gemini"`), spoken to the gateway as Chat Completions.

`{base_url}/v1beta/models/{upstream}:generateContent`, `:streamGenerateContent?alt=sse`
and `:batchEmbedContents`, with the key in `x-goog-api-key`. `GenerateContentProvider`
is the generateContent side that Vertex AI's Gemini shares (gateway.providers.vertex),
wherever its models' paths are and however it authenticates. The translation itself
is in `gemini_translate`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING
from urllib.parse import quote

import aiohttp

from model_gateway.gateway.providers.gemini.gemini_translate import (
    EMBED_BATCH,
    BatchEmbedAnswer,
    GeminiChunkTranslator,
    GenerateContentAnswer,
    chat_completion,
    embed_request,
    embed_texts,
    embeddings_answer,
    generate_request,
    key_invalid,
)
from model_gateway.gateway.providers.shapes import checked
from model_gateway.gateway.providers.upstream import (
    Acceptance,
    HttpProvider,
    UpstreamFailure,
    malformed,
    parse_json,
    reported_error,
)

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject
    from model_gateway.pipeline.errors import GatewayError

# The most of a refusal's body read to find its reason: Google's error bodies are far
# smaller, and nothing more of it is kept.
ERROR_READ_BYTES = 8 << 10


class GenerateContentProvider(HttpProvider):
    """Chat through generateContent and its SSE stream."""

    def model_path(self, model: str, method: str) -> str:
        """The path of a model's method ("generateContent", ...)."""
        raise NotImplementedError

    async def _generate(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        path = self.model_path(request["model"], "generateContent")
        answer = await self.post_json(path, generate_request(request), acceptance)
        answer = checked(self.name, answer, GenerateContentAnswer)
        if answer.get("error") is not None:
            raise reported_error(self.name)
        return answer

    async def chat(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        return chat_completion(await self._generate(request, acceptance), request["model"])

    def chat_stream(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[JSONObject]:
        path = self.model_path(request["model"], "streamGenerateContent") + "?alt=sse"
        translator = GeminiChunkTranslator(request["model"])
        return self.translated_chunks(
            path, generate_request(request), acceptance, translator, self._event
        )

    def _event(self, data: str) -> JSONObject:
        payload = checked(self.name, parse_json(self.name, data), GenerateContentAnswer)
        if payload.get("error") is not None:
            raise reported_error(self.name)
        return payload


class GeminiProvider(GenerateContentProvider):
    kind = "gemini"

    def headers(self) -> dict[str, str]:
        credential = self.config.credential()
        return {"x-goog-api-key": credential} if credential else {}

    def model_path(self, model: str, method: str) -> str:
        return f"/v1beta/models/{quote(model, safe='')}:{method}"

    async def failure(self, response: aiohttp.ClientResponse) -> GatewayError:
        # A wrong key is a 400 to Google, told apart by its reason; a missing one is 403.
        if response.status == 400 and key_invalid(await _head(response)):
            return UpstreamFailure("credentials_rejected", detail="HTTP 400 API_KEY_INVALID")
        return await super().failure(response)

    async def embeddings(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        texts = embed_texts(request)
        model = request["model"]
        path = self.model_path(model, "batchEmbedContents")
        vectors: list[list[float]] = []
        for start in range(0, len(texts), EMBED_BATCH):
            batch = texts[start : start + EMBED_BATCH]
            body = embed_request(batch, model, request.get("dimensions"))
            answer = checked(
                self.name, await self.post_json(path, body, acceptance), BatchEmbedAnswer
            )
            if len(answer["embeddings"]) != len(batch):
                raise malformed(self.name)
            vectors += [embedding["values"] for embedding in answer["embeddings"]]
        return embeddings_answer(vectors, model)


async def _head(response: aiohttp.ClientResponse) -> bytes:
    """At most ERROR_READ_BYTES of a refusal's body (b"" when it cannot be read)."""
    head = b""
    try:
        while len(head) < ERROR_READ_BYTES:
            read = await response.content.read(ERROR_READ_BYTES - len(head))
            if not read:
                break
            head += read
    except (aiohttp.ClientError, OSError):
        return b""
    return head
