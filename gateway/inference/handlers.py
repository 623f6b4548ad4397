"""POST /v1/chat/completions and POST /v1/responses.

Both run on every model: Chat Completions go to the model's provider as they are (the
provider translates if it speaks something else); Responses pass through to providers
with a native Responses endpoint and are translated to chat and back for the others.

Metering contract (read by the reservation and settle stages): `ctx.usage`,
`ctx.outcome` and `ctx.response_sha256` are set before the response's last message.
A failure before anything was sent raises, and leaves `ctx.outcome` None.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import TYPE_CHECKING

import msgspec
import orjson
from starlette.responses import Response

from gateway.config import ModelConfig
from gateway.errors import JSON_CONTENT_TYPE, ProviderTimeout
from gateway.inference.renderers import (
    ChatRenderer,
    NativeResponsesRenderer,
    TranslatedResponsesRenderer,
    chat_tokens,
    responses_tokens,
)
from gateway.inference.responses_translate import chat_request, response_from_chat
from gateway.inference.schemas import ChatRequest, ResponsesRequest
from gateway.inference.streaming import Upstream, open_stream
from gateway.inference.tokens import (
    chat_prompt_text,
    completion_text,
    estimate_tokens,
    response_text,
    responses_prompt_text,
)
from gateway.pricing import InferencePricing
from gateway.providers import Provider, Providers, ResponsesUnsupported
from gateway.routes import Endpoint
from gateway.validation import decoder

if TYPE_CHECKING:
    from pipeline.context import RequestContext

log = logging.getLogger("gateway.inference")

_JSON = JSON_CONTENT_TYPE.decode()
_CHAT_LIMITS = ("max_completion_tokens", "max_tokens")


def upstream_chat(request: dict, model: ModelConfig, model_id: str, *, stream: bool) -> dict:
    """The chat request as sent upstream: upstream model name, output limit within the model's."""
    body = {k: v for k, v in request.items() if k != "stream"}
    if not stream:
        body.pop("stream_options", None)
    body["model"] = model.upstream or model_id
    limits = [key for key in _CHAT_LIMITS if key in body]
    for key in limits:
        body[key] = min(body[key], model.max_output_tokens)
    if not limits:
        body["max_completion_tokens"] = model.max_output_tokens
    return body


def upstream_responses(request: dict, model: ModelConfig, model_id: str) -> dict:
    body = {k: v for k, v in request.items() if k != "stream"}
    body["model"] = model.upstream or model_id
    body["max_output_tokens"] = min(
        body.get("max_output_tokens") or model.max_output_tokens, model.max_output_tokens
    )
    return body


def _estimate(prompt: str, output: str) -> dict[str, int]:
    return {"input_tokens": estimate_tokens(prompt), "output_tokens": estimate_tokens(output)}


def _respond(ctx: RequestContext, payload: dict, usage: dict[str, int]) -> Response:
    raw = orjson.dumps(payload)
    ctx.usage = usage
    ctx.response_sha256 = hashlib.sha256(raw).hexdigest()
    ctx.outcome = "succeeded"
    return Response(raw, media_type=_JSON)


class InferenceHandlers:
    def __init__(self, providers: Providers, timeout_s: float) -> None:
        self.providers = providers
        self.timeout_s = timeout_s

    def routes(self) -> list[Endpoint]:
        return [
            Endpoint(
                "POST",
                "/v1/chat/completions",
                "inference",
                self.chat_completions,
                decode=decoder(ChatRequest),
                pricing=InferencePricing(),
            ),
            Endpoint(
                "POST",
                "/v1/responses",
                "inference",
                self.responses,
                decode=decoder(ResponsesRequest),
                pricing=InferencePricing(),
            ),
        ]

    async def _call(self, provider: Provider, call):
        """Await one whole upstream answer within the gateway timeout."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await call
        except TimeoutError:
            log.warning("provider %s gave no answer within %.1f s", provider.name, self.timeout_s)
            raise ProviderTimeout() from None

    def _upstream(self, provider: Provider, events) -> Upstream:
        return Upstream(events, self.timeout_s, provider.name)

    async def chat_completions(self, ctx: RequestContext):
        request = msgspec.to_builtins(ctx.payload)
        provider = self.providers[ctx.model.provider]
        stream = ctx.payload.stream
        body = upstream_chat(request, ctx.model, ctx.model_id, stream=stream)
        prompt = chat_prompt_text(body)
        if stream:
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            upstream = self._upstream(provider, provider.chat_stream(body))
            return await open_stream(
                ctx, upstream, ChatRenderer(ctx.model_id, include_usage), prompt
            )
        completion = await self._call(provider, provider.chat(body))
        completion["model"] = ctx.model_id
        usage = chat_tokens(completion.get("usage")) or _estimate(
            prompt, completion_text(completion)
        )
        return _respond(ctx, completion, usage)

    async def responses(self, ctx: RequestContext):
        request = msgspec.to_builtins(ctx.payload)
        provider = self.providers[ctx.model.provider]
        prompt = responses_prompt_text(request)
        if provider.native_responses is not False:
            try:
                response = await self._native_responses(ctx, provider, request, prompt)
            except ResponsesUnsupported:
                pass
            else:
                provider.native_responses = True
                return response
        response = await self._translated_responses(ctx, provider, request, prompt)
        if provider.native_responses is None:
            # It answered chat where it had no Responses endpoint: translate from now on.
            log.info("provider %s has no Responses endpoint; translating", provider.name)
            provider.native_responses = False
        return response

    async def _native_responses(self, ctx, provider, request: dict, prompt: str):
        body = upstream_responses(request, ctx.model, ctx.model_id)
        if ctx.payload.stream:
            upstream = self._upstream(provider, provider.responses_stream(body))
            return await open_stream(ctx, upstream, NativeResponsesRenderer(ctx.model_id), prompt)
        result = await self._call(provider, provider.responses(body))
        result["model"] = ctx.model_id
        usage = responses_tokens(result.get("usage")) or _estimate(prompt, response_text(result))
        return _respond(ctx, result, usage)

    async def _translated_responses(self, ctx, provider, request: dict, prompt: str):
        stream = ctx.payload.stream
        body = upstream_chat(chat_request(request), ctx.model, ctx.model_id, stream=stream)
        if stream:
            upstream = self._upstream(provider, provider.chat_stream(body))
            return await open_stream(ctx, upstream, TranslatedResponsesRenderer(request), prompt)
        completion = await self._call(provider, provider.chat(body))
        result = response_from_chat(completion, request)
        usage = chat_tokens(completion.get("usage")) or _estimate(
            prompt, completion_text(completion)
        )
        return _respond(ctx, result, usage)
