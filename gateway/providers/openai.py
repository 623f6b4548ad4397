"""Any OpenAI-compatible server: OpenAI, vLLM, Ollama, llama.cpp, OpenRouter...

Chat Completions pass through as they are. Streams always ask the upstream for usage
(`stream_options.include_usage`). The Responses endpoint is used when the upstream has
one; a server answering 404/405/501 there is served by translation instead (the
handlers remember that once translation has worked).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from model_gateway.gateway.providers.shapes import (
    ChatAnswer,
    ResponsesAnswer,
    ResponsesEvent,
    checked,
)
from model_gateway.gateway.providers.upstream import (
    Acceptance,
    HttpProvider,
    parse_json,
    reported_error,
    stream_ended_early,
)

_RESPONSES_END = frozenset({"response.completed", "response.incomplete"})
_RESPONSES_FAILED = frozenset({"response.failed", "error"})


class OpenAIProvider(HttpProvider):
    kind = "openai"
    native_responses: bool | None = None

    def headers(self) -> dict[str, str]:
        credential = self.config.credential()
        return {"authorization": f"Bearer {credential}"} if credential else {}

    async def chat(self, request: dict, acceptance: Acceptance) -> dict:
        answer = await self.post_json("/chat/completions", request, acceptance)
        return checked(self.name, answer, ChatAnswer)

    async def chat_stream(self, request: dict, acceptance: Acceptance) -> AsyncIterator[dict]:
        options = {**(request.get("stream_options") or {}), "include_usage": True}
        body = {**request, "stream": True, "stream_options": options}
        done = finished = False
        events = self.post_events("/chat/completions", body, acceptance)
        async with contextlib.aclosing(events):
            async for event in events:
                if done:
                    continue  # read on to the end so that the connection is reused
                if event.data.strip() == "[DONE]":
                    done = True
                    continue
                chunk = checked(self.name, parse_json(self.name, event.data), ChatAnswer)
                if chunk.get("error"):  # in-band error from the upstream: never its text
                    raise reported_error(self.name)
                finished = finished or any(
                    choice.get("finish_reason") for choice in chunk.get("choices") or ()
                )
                yield chunk
        if not (done or finished):
            raise stream_ended_early(self.name)

    async def responses(self, request: dict, acceptance: Acceptance) -> dict:
        answer = await self.post_json("/responses", request, acceptance, optional_endpoint=True)
        return checked(self.name, answer, ResponsesAnswer)

    async def responses_stream(
        self, request: dict, acceptance: Acceptance
    ) -> AsyncIterator[tuple[str, dict]]:
        body = {**request, "stream": True}
        done = False
        events = self.post_events("/responses", body, acceptance, optional_endpoint=True)
        async with contextlib.aclosing(events):
            async for event in events:
                if done or event.data.strip() == "[DONE]":
                    continue
                payload = checked(self.name, parse_json(self.name, event.data), ResponsesEvent)
                name = event.event or payload.get("type") or ""
                if name in _RESPONSES_FAILED:
                    raise reported_error(self.name)
                done = name in _RESPONSES_END
                yield name, payload
        if not done:
            raise stream_ended_early(self.name)
