"""Anthropic's Messages API, spoken to the gateway as Chat Completions.

The translation itself is in `anthropic_messages`; this module is the HTTP side.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from model_gateway.gateway.config import ProviderConfig
from model_gateway.gateway.providers.anthropic.anthropic_messages import (
    ChunkTranslator,
    chat_completion,
    messages_request,
)
from model_gateway.gateway.providers.shapes import MessagesAnswer, MessagesEvent, checked
from model_gateway.gateway.providers.upstream import (
    Acceptance,
    HttpProvider,
    drained,
    parse_json,
    reported_error,
    stream_ended_early,
)

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject

API_VERSION = "2023-06-01"


class AnthropicProvider(HttpProvider):
    kind = "anthropic"

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

    async def chat_stream(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[JSONObject]:
        body = {**messages_request(request), "stream": True}
        translator = ChunkTranslator(request["model"])
        events = self.post_events(self.path, body, acceptance)
        async with contextlib.aclosing(events):
            async for event in events:
                payload = checked(self.name, parse_json(self.name, event.data), MessagesEvent)
                if payload.get("type") == "error":
                    raise reported_error(self.name)
                for chunk in translator.feed(payload):
                    yield chunk
                if translator.done:
                    await drained(events)
                    break
        if not translator.done:
            raise stream_ended_early(self.name)
