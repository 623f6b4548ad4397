"""POST /v1/chat/completions, /v1/responses, /v1/messages and /v1/messages/count_tokens.

All run on every chat model: Chat Completions go to the model's provider as they are (the
provider translates if it speaks something else; a chat stream from an upstream that
speaks chat is passed through, gateway.inference.passthrough); Responses pass through to providers
with a native Responses endpoint and are translated to chat and back for the others;
Anthropic's Messages pass through to Anthropic upstreams and are translated to chat and
back for the others (gateway.inference.messages).

Metering contract (read by the settle stage): `ctx.billing` is set before the
response's last message. A failure before anything was sent raises, and leaves it None;
a client that leaves after the upstream accepted the request is billed its prompt, as
`cancelled`. Usage is billed as `usage.billing` checks it (bad counts: the gateway's).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import orjson
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp

from model_gateway.gateway.inference.messages.messages_passthrough import (
    MessagesPassThrough,
    native_body,
    native_output,
)
from model_gateway.gateway.inference.messages.messages_schemas import (
    CountTokensRequest,
    MessagesRequest,
)
from model_gateway.gateway.inference.messages.messages_stream import TranslatedMessagesRenderer
from model_gateway.gateway.inference.messages.messages_translate import (
    chat_from_messages,
    message_from_chat,
)
from model_gateway.gateway.inference.messages.messages_upstream import (
    AfterHeaders,
    anthropic_beta,
    upstream_messages,
)
from model_gateway.gateway.inference.messages.messages_usage import (
    anthropic_usage,
    chat_cache_counts,
    native_counts,
)
from model_gateway.gateway.inference.output_limit import Delivered, past_the_limit
from model_gateway.gateway.inference.passthrough import ChatPassThrough
from model_gateway.gateway.inference.renderers import (
    ChatRenderer,
    NativeResponsesRenderer,
    TranslatedResponsesRenderer,
)
from model_gateway.gateway.inference.responses_translate import chat_request, response_from_chat
from model_gateway.gateway.inference.schemas import ChatRequest, ResponsesRequest
from model_gateway.gateway.inference.streaming import Renderer, Upstream, open_stream
from model_gateway.gateway.inference.tokens import (
    chat_prompt_text,
    completion_text,
    estimate_tokens,
    messages_prompt_text,
    response_text,
    responses_prompt_text,
)
from model_gateway.gateway.inference.usage import (
    CHAT_KEYS,
    RESPONSES_KEYS,
    Prompt,
    Text,
    UsageKeys,
    billed_usage,
    cancelled,
    reported,
    shown_usage,
)
from model_gateway.gateway.inference.wait_bound import WaitBound
from model_gateway.gateway.metering.pricing import (
    InferencePricing,
    held_output_tokens,
    output_limit,
)
from model_gateway.gateway.providers import Provider, Providers, ResponsesUnsupported
from model_gateway.gateway.providers.sse_blocks import parse_checked
from model_gateway.gateway.providers.upstream import Acceptance
from model_gateway.gateway.routing.attempts import attempt_chain, stream_ended
from model_gateway.pipeline.context import Billing
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import JSON_CONTENT_TYPE, ProviderTimeout
from model_gateway.pipeline.validation import decoder

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject
    from model_gateway.gateway.ops.metrics import Metrics
    from model_gateway.pipeline.context import RequestContext
    from model_gateway.pipeline.ports import ModelInfo

log = logging.getLogger("gateway.inference")

_JSON = JSON_CONTENT_TYPE.decode()
_CHAT_LIMITS = ("max_completion_tokens", "max_tokens")

E = TypeVar("E")  # an upstream stream's events
# One attempt at a Messages API request: (provider, upstream model, body, prompt, beta).
MessagesAttempt = Callable[[Provider, str, "JSONObject", Prompt, str | None], Awaitable[Response]]
T = TypeVar("T")  # an upstream's whole answer


def upstream_chat(
    request: JSONObject,
    model: ModelInfo,
    model_id: str,
    *,
    stream: bool,
    upstream: str | None = None,
) -> JSONObject:
    """The chat request as sent upstream: upstream model name (`upstream`, for a fallback),
    output limit within the model's."""
    body = {k: v for k, v in request.items() if k != "stream"}
    if not stream:
        body.pop("stream_options", None)
    body["model"] = upstream or model.upstream or model_id
    limits = [key for key in _CHAT_LIMITS if key in body]
    for key in limits:
        body[key] = min(body[key], model.max_output_tokens)
    if not limits:
        body["max_completion_tokens"] = model.max_output_tokens
    return body


def upstream_responses(
    request: JSONObject, model: ModelInfo, model_id: str, upstream: str | None = None
) -> JSONObject:
    body = {k: v for k, v in request.items() if k != "stream"}
    body["model"] = upstream or model.upstream or model_id
    body["max_output_tokens"] = output_limit(body.get("max_output_tokens"), model.max_output_tokens)
    return body


def _show_billed(
    answer: JSONObject, keys: UsageKeys, prompt: Prompt, output: Text
) -> dict[str, Any]:
    """The counts of the answer's usage as the upstream reported them (`keys` name them);
    the answer is left showing the counts that are billed."""
    counts = reported(answer.get("usage"), keys)
    if "usage" in answer:
        answer["usage"] = shown_usage(answer["usage"], prompt, output, keys)
    return counts


def _served(ctx: RequestContext) -> tuple[str, ModelInfo]:
    """The requested model's id and the model, as the policy stage resolved them."""
    assert ctx.model_id is not None and ctx.model is not None
    return ctx.model_id, ctx.model


def _asked(ctx: RequestContext) -> str:
    """The model as the client named it (its id or an alias): what answers show."""
    name: str = ctx.payload.model
    return name


def _held_output(ctx: RequestContext) -> int:
    payload: ChatRequest | ResponsesRequest | MessagesRequest = ctx.payload
    _, model = _served(ctx)
    return held_output_tokens(payload.output_limit, model.max_output_tokens)


def _delivered(ctx: RequestContext) -> Delivered:
    """A stream's count of delivered output, stopped at what the hold covers."""
    return Delivered(_held_output(ctx))


def _respond(
    ctx: RequestContext, raw: bytes, counts: dict[str, Any], prompt: Prompt, output: Text
) -> Response:
    """A whole answer (its JSON), billed by the reported `counts` as `usage.billing`
    checks them; one past the held output is the upstream's failure, billed its input only."""
    usage, source = billed_usage(counts, prompt, output)
    if usage["output_tokens"] > _held_output(ctx):
        ctx.billing = Billing("failed", {**usage, "output_tokens": 0}, None, source)
        raise past_the_limit()
    ctx.billing = Billing("succeeded", usage, hashlib.sha256(raw).hexdigest(), source)
    return Response(raw, media_type=_JSON)


class InferenceHandlers:
    def __init__(
        self, providers: Providers, timeout_s: float, metrics: Metrics | None = None
    ) -> None:
        self.providers = providers
        self.timeout_s = timeout_s
        self.metrics = metrics

    def routes(self) -> list[Endpoint]:
        return [
            Endpoint(
                "POST",
                "/v1/chat/completions",
                "inference",
                self.chat_completions,
                decode=decoder(ChatRequest),
                pricing=InferencePricing(),
                mode="chat",
            ),
            Endpoint(
                "POST",
                "/v1/responses",
                "inference",
                self.responses,
                decode=decoder(ResponsesRequest),
                pricing=InferencePricing(),
                mode="chat",
            ),
            Endpoint(
                "POST",
                "/v1/messages",
                "inference",
                self.messages,
                decode=decoder(MessagesRequest),
                pricing=InferencePricing(),
                mode="chat",
            ),
            Endpoint(  # never billed: no pricing, no hold, no receipt
                "POST",
                "/v1/messages/count_tokens",
                "inference",
                self.count_tokens,
                decode=decoder(CountTokensRequest),
                mode="chat",
            ),
        ]

    async def _call(
        self,
        ctx: RequestContext,
        provider: Provider,
        call: Awaitable[T],
        acceptance: Acceptance,
        prompt: Prompt,
    ) -> T:
        """Await one whole upstream answer within the gateway timeout."""
        started = time.perf_counter()
        bound = WaitBound(self.timeout_s)  # 3.6 µs a request on uvloop, asyncio.timeout 6.5
        try:
            with bound:
                return await call
        except TimeoutError:
            raise ProviderTimeout() from None  # logged by the attempt chain
        except asyncio.CancelledError:
            if acceptance.accepted:  # the client left while the answer was on its way
                ctx.billing = cancelled(prompt)
            raise
        finally:
            bound.close()
            ctx.upstream_seconds += time.perf_counter() - started

    def _upstream(
        self,
        ctx: RequestContext,
        provider: Provider,
        events: AsyncGenerator[E],
        acceptance: Acceptance,
    ) -> Upstream[E]:
        ended = partial(stream_ended, ctx, self.providers, self.metrics, provider.name)
        return Upstream(events, self.timeout_s, provider.name, acceptance, ctx, ended)

    async def chat_completions(self, ctx: RequestContext) -> Response:
        payload: ChatRequest = ctx.payload
        request: JSONObject = msgspec.to_builtins(payload)

        async def serve(provider: Provider, upstream: str) -> Response:
            return await self._chat(ctx, provider, upstream, request)

        return await attempt_chain(ctx, self.providers, self.metrics, serve)

    async def _chat(
        self, ctx: RequestContext, provider: Provider, upstream_model: str, request: JSONObject
    ) -> Response:
        payload: ChatRequest = ctx.payload
        model_id, model = _served(ctx)
        stream = payload.stream
        body = upstream_chat(request, model, model_id, stream=stream, upstream=upstream_model)
        prompt = Prompt(chat_prompt_text(body), len(ctx.body))
        acceptance = Acceptance()
        if stream:
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            # Each kind of events has its renderer: batches of checked events, or chunks.
            if provider.chat_pass_through:
                batches = provider.chat_events(body, acceptance)
                passthrough = ChatPassThrough(_asked(ctx), include_usage, prompt, _delivered(ctx))
                checked = self._upstream(ctx, provider, batches, acceptance)
                return await open_stream(ctx, checked, passthrough, prompt)
            chunks = provider.chat_stream(body, acceptance)
            renderer = ChatRenderer(_asked(ctx), include_usage, prompt, _delivered(ctx))
            upstream = self._upstream(ctx, provider, chunks, acceptance)
            return await open_stream(ctx, upstream, renderer, prompt)
        call = provider.chat(body, acceptance)
        completion = await self._call(ctx, provider, call, acceptance, prompt)
        completion["model"] = _asked(ctx)
        output = functools.partial(completion_text, completion)  # read only if a count is missing
        counts = _show_billed(completion, CHAT_KEYS, prompt, output)
        return _respond(ctx, orjson.dumps(completion), counts, prompt, output)

    async def responses(self, ctx: RequestContext) -> Response:
        payload: ResponsesRequest = ctx.payload
        request: JSONObject = msgspec.to_builtins(payload)
        prompt = Prompt(responses_prompt_text(request), len(ctx.body))

        async def serve(provider: Provider, upstream: str) -> Response:
            return await self._responses(ctx, provider, upstream, request, prompt)

        return await attempt_chain(ctx, self.providers, self.metrics, serve)

    async def _responses(
        self,
        ctx: RequestContext,
        provider: Provider,
        upstream: str,
        request: JSONObject,
        prompt: Prompt,
    ) -> Response:
        if provider.native_responses is not False:
            try:
                response = await self._native_responses(ctx, provider, upstream, request, prompt)
            except ResponsesUnsupported:
                pass
            else:
                provider.native_responses = True
                return response
        response = await self._translated_responses(ctx, provider, upstream, request, prompt)
        if provider.native_responses is None:
            # It answered chat where it had no Responses endpoint: translate from now on.
            log.info("provider %s has no Responses endpoint; translating", provider.name)
            provider.native_responses = False
        return response

    async def _native_responses(
        self,
        ctx: RequestContext,
        provider: Provider,
        upstream_model: str,
        request: JSONObject,
        prompt: Prompt,
    ) -> Response:
        payload: ResponsesRequest = ctx.payload
        model_id, model = _served(ctx)
        body = upstream_responses(request, model, model_id, upstream_model)
        acceptance = Acceptance()
        if payload.stream:
            events = provider.responses_stream(body, acceptance)
            upstream = self._upstream(ctx, provider, events, acceptance)
            renderer = NativeResponsesRenderer(_asked(ctx), prompt, _delivered(ctx))
            return await open_stream(ctx, upstream, renderer, prompt)
        call = provider.responses(body, acceptance)
        result = await self._call(ctx, provider, call, acceptance, prompt)
        result["model"] = _asked(ctx)
        output = functools.partial(response_text, result)
        counts = _show_billed(result, RESPONSES_KEYS, prompt, output)
        return _respond(ctx, orjson.dumps(result), counts, prompt, output)

    async def _translated_responses(
        self,
        ctx: RequestContext,
        provider: Provider,
        upstream_model: str,
        request: JSONObject,
        prompt: Prompt,
    ) -> Response:
        def answer(completion: JSONObject, output: Text) -> bytes:
            # The chat usage is the one checked and billed; the Response shows its counts.
            _show_billed(completion, CHAT_KEYS, prompt, output)
            return orjson.dumps(response_from_chat(completion, request))

        def renderer() -> TranslatedResponsesRenderer:
            return TranslatedResponsesRenderer(request, prompt, _delivered(ctx))

        chat = chat_request(request)
        return await self._through_chat(
            ctx, provider, upstream_model, chat, prompt, renderer, answer
        )

    async def _through_chat(
        self,
        ctx: RequestContext,
        provider: Provider,
        upstream_model: str,
        chat: JSONObject,
        prompt: Prompt,
        renderer: Callable[[], Renderer[JSONObject]],
        answer: Callable[[JSONObject, Text], bytes],
    ) -> Response:
        """Another API served by a provider's chat: `chat` is the request translated, a
        stream is rendered by `renderer()`, a whole completion becomes `answer`'s bytes.
        Chat reasoning has no item in a Response nor a block in a Message: it is neither
        sent nor counted."""
        model_id, model = _served(ctx)
        stream: bool = ctx.payload.stream
        body = upstream_chat(chat, model, model_id, stream=stream, upstream=upstream_model)
        acceptance = Acceptance()
        if stream:
            chunks = provider.chat_stream(body, acceptance)
            upstream = self._upstream(ctx, provider, chunks, acceptance)
            return await open_stream(ctx, upstream, renderer(), prompt)
        call = provider.chat(body, acceptance)
        completion = await self._call(ctx, provider, call, acceptance, prompt)
        output = functools.partial(completion_text, completion, reasoning=False)
        counts = reported(completion.get("usage"), CHAT_KEYS)
        return _respond(ctx, answer(completion, output), counts, prompt, output)

    async def messages(self, ctx: RequestContext) -> ASGIApp:
        async def attempt(
            provider: Provider, upstream: str, request: JSONObject, prompt: Prompt, beta: str | None
        ) -> Response:
            if provider.native_messages:
                return await self._native_messages(ctx, provider, upstream, request, prompt, beta)
            return await self._translated_messages(ctx, provider, upstream, request, prompt)

        return self._on_messages(ctx, attempt)

    def _on_messages(self, ctx: RequestContext, attempt: MessagesAttempt) -> ASGIApp:
        """A Messages API request through the attempt chain: the body as the client sent it
        (an Anthropic upstream gets it so: messages_upstream), its prompt, and the client's
        anthropic-beta header, read once the headers are there."""
        request: JSONObject = parse_checked(ctx.body)
        prompt = Prompt(messages_prompt_text(request), len(ctx.body))

        async def serve(headers: Headers) -> Response:
            beta = anthropic_beta(headers)

            async def one(provider: Provider, upstream: str) -> Response:
                return await attempt(provider, upstream, request, prompt, beta)

            return await attempt_chain(ctx, self.providers, self.metrics, one)

        return AfterHeaders(ctx, serve)

    async def _native_messages(
        self,
        ctx: RequestContext,
        provider: Provider,
        upstream_model: str,
        request: JSONObject,
        prompt: Prompt,
        beta: str | None,
    ) -> Response:
        payload: MessagesRequest = ctx.payload
        model_id, model = _served(ctx)
        body = upstream_messages(request, model, model_id, upstream_model)
        acceptance = Acceptance()
        if payload.stream:
            events = provider.messages_events(body, acceptance, beta)
            upstream = self._upstream(ctx, provider, events, acceptance)
            renderer = MessagesPassThrough(_asked(ctx), prompt, _delivered(ctx))
            return await open_stream(ctx, upstream, renderer, prompt)
        call = provider.messages(body, acceptance, beta)
        answer = await self._call(ctx, provider, call, acceptance, prompt)
        output = functools.partial(native_output, answer.message)
        counts = native_counts(answer.message.get("usage"))
        raw = native_body(answer, _asked(ctx), prompt, output)
        return _respond(ctx, raw, counts, prompt, output)

    async def _translated_messages(
        self,
        ctx: RequestContext,
        provider: Provider,
        upstream_model: str,
        request: JSONObject,
        prompt: Prompt,
    ) -> Response:
        def answer(completion: JSONObject, output: Text) -> bytes:
            usage = completion.get("usage")
            billed, _ = billed_usage(reported(usage, CHAT_KEYS), prompt, output)
            shown = anthropic_usage(billed, *chat_cache_counts(usage))
            return orjson.dumps(message_from_chat(completion, _asked(ctx), shown))

        def renderer() -> TranslatedMessagesRenderer:
            return TranslatedMessagesRenderer(_asked(ctx), prompt, _delivered(ctx))

        chat = chat_from_messages(request)
        return await self._through_chat(
            ctx, provider, upstream_model, chat, prompt, renderer, answer
        )

    async def count_tokens(self, ctx: RequestContext) -> ASGIApp:
        async def attempt(
            provider: Provider, upstream: str, request: JSONObject, prompt: Prompt, beta: str | None
        ) -> Response:
            model_id, model = _served(ctx)
            body = upstream_messages(request, model, model_id, upstream)
            acceptance = Acceptance()
            call = provider.count_tokens(body, acceptance, beta)
            counted = await self._call(ctx, provider, call, acceptance, prompt)
            tokens = estimate_tokens(prompt.text) if counted is None else counted
            return Response(orjson.dumps({"input_tokens": tokens}), media_type=_JSON)

        return self._on_messages(ctx, attempt)
