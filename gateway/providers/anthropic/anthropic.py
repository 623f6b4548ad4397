"""Anthropic's Messages API, spoken to the gateway as Chat Completions, and passed through
as it is for /v1/messages (`native_messages`).

The translation itself is in `anthropic_messages`, the pass-through stream's reader in
`messages_events`; this module is the HTTP side.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

import aiohttp

from model_gateway.gateway.config import ProviderConfig
from model_gateway.gateway.inference.usage import token_count
from model_gateway.gateway.providers.anthropic.anthropic_messages import (
    ChunkTranslator,
    chat_completion,
    messages_request,
)
from model_gateway.gateway.providers.anthropic.messages_events import (
    MessagesStreamEvent,
    NativeAnswer,
    NativeMessagesEvents,
)
from model_gateway.gateway.providers.shapes import MessagesAnswer, MessagesEvent, checked
from model_gateway.gateway.providers.upstream import (
    Acceptance,
    HttpProvider,
    ResponsesUnsupported,
    parse_json,
    reported_error,
    unreachable,
)

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

API_VERSION = "2023-06-01"


def _beta(value: str | None) -> dict[str, str] | None:
    """The client's anthropic-beta header, for a pass-through request."""
    return {"anthropic-beta": value} if value else None


class AnthropicProvider(HttpProvider):
    kind = "anthropic"
    native_messages = True

    def __init__(self, name: str, config: ProviderConfig) -> None:
        super().__init__(name, config)
        # base_url is the host ("https://api.anthropic.com"); a trailing /v1 is accepted too.
        self.path = "/messages" if self.base_url.endswith("/v1") else "/v1/messages"

    def headers(self) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        credential = self.config.credential()
        if credential:
            headers["x-api-key"] = credential
        return headers

    async def chat(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        message = await self.post_json(self.path, messages_request(request), acceptance)
        return chat_completion(checked(self.name, message, MessagesAnswer), request["model"])

    def chat_stream(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[JSONObject]:
        body = {**messages_request(request), "stream": True}
        return self.translated_chunks(
            self.path, body, acceptance, ChunkTranslator(request["model"]), self._event
        )

    def _event(self, data: str) -> JSONObject:
        payload = checked(self.name, parse_json(self.name, data), MessagesEvent)
        if payload.get("type") == "error":
            raise reported_error(self.name)
        return payload

    async def messages(
        self, request: JSONObject, acceptance: Acceptance, beta: str | None
    ) -> NativeAnswer:
        response = await self._post(self.path, request, acceptance, extra_headers=_beta(beta))
        try:
            data = await self._answer(response)  # its bytes: passed on as they came
        except (aiohttp.ClientError, OSError) as exc:
            raise unreachable(self.name, exc) from None
        finally:
            response.close()
        message = checked(self.name, parse_json(self.name, data), MessagesAnswer)
        return NativeAnswer(data, message)

    async def messages_events(
        self, request: JSONObject, acceptance: Acceptance, beta: str | None
    ) -> AsyncGenerator[list[MessagesStreamEvent]]:
        body = {**request, "stream": True}
        reads = self.post_stream(self.path, body, acceptance, extra_headers=_beta(beta))
        async for batch in self.batches(reads, NativeMessagesEvents(self.name)):
            yield batch

    async def count_tokens(
        self, request: JSONObject, acceptance: Acceptance, beta: str | None
    ) -> int | None:
        """The upstream's own count; None (the gateway estimates) when it has no such
        endpoint (an Anthropic-compatible server) or its count is none."""
        try:
            answer = await self.post_json(
                self.path + "/count_tokens",
                request,
                acceptance,
                optional_endpoint=True,
                extra_headers=_beta(beta),
            )
        except ResponsesUnsupported:
            return None
        return token_count(answer.get("input_tokens"))
