"""POST /v1/embeddings: OpenAI's Embeddings API, served by models of mode "embedding".

The request's `input` reaches the provider as a list: of strings, or of token-id lists
(one string or one token-id list becomes a list of one). Providers answer float vectors;
`encoding_format` "base64" is the gateway's own work, as OpenAI encodes it (the vector's
little-endian float32 bytes in base64). Billed on input tokens at the model's input price
(gateway.metering.pricing.EmbeddingsPricing): the upstream's count when it is one, else
the gateway's (each text's bytes / 4, one token a token id). Attempts, fallbacks and the
timeout are chat's (routing.attempts, InferenceHandlers).
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import orjson
from msgspec import UNSET, UnsetType
from starlette.responses import Response

from model_gateway.gateway.inference.schemas import NonEmpty, PositiveInt
from model_gateway.gateway.inference.usage import CHAT_KEYS, Prompt, billed_usage, reported
from model_gateway.gateway.metering.pricing import EmbeddingsPricing
from model_gateway.gateway.providers.upstream import Acceptance, malformed
from model_gateway.gateway.routing.attempts import attempt_chain
from model_gateway.pipeline.context import Billing
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import JSON_CONTENT_TYPE, InvalidRequest
from model_gateway.pipeline.validation import decoder

if TYPE_CHECKING:
    from model_gateway.gateway.inference.handlers import InferenceHandlers
    from model_gateway.gateway.inference.json_types import JSONObject
    from model_gateway.gateway.providers import Provider
    from model_gateway.pipeline.context import RequestContext

_JSON = JSON_CONTENT_TYPE.decode()
MAX_INPUTS = 2048  # inputs in one request, as OpenAI allows
# A token id to the gateway's count, which reads text (tokens.estimate_tokens: 4 bytes
# a token): one token each.
_ID_AS_TEXT = " " * 4

# What the provider embeds: texts, or token-id lists.
Inputs = list[str] | list[list[int]]


def _token_ids(value: list[Any], where: str) -> list[int]:
    if not value:
        raise InvalidRequest("A list of token ids may not be empty.", param=where)
    for j, token in enumerate(value):
        if type(token) is not int or token < 0:  # bool is no token id
            raise InvalidRequest("A token id is a non-negative integer.", param=f"{where}.{j}")
    return value


def _input_item(item: Any, i: int, texts: bool) -> str | list[int]:
    """Input `i` of a list whose first input is a text (`texts`) or a token-id list."""
    where = f"input.{i}"
    if texts and isinstance(item, str):
        if not item:
            raise InvalidRequest("An input may not be an empty string.", param=where)
        return item
    if not texts and isinstance(item, list):
        return _token_ids(item, where)
    message = "Every input is a string, or every input a list of token ids."
    raise InvalidRequest(message, param=where)


def _inputs(value: str | list[Any]) -> list[Any]:
    """The request's input as the provider takes it (`Inputs`); invalid_request else."""
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("The input may not be an empty string.", param="input")
        return [value]
    if not value:
        raise InvalidRequest("The input may not be an empty list.", param="input")
    if all(type(token) is int for token in value):
        return [_token_ids(value, "input")]  # one input, as token ids
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(f"At most {MAX_INPUTS} inputs a request.", param="input")
    texts = isinstance(value[0], str)
    return [_input_item(item, i, texts) for i, item in enumerate(value)]


class EmbeddingsRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    model: NonEmpty
    # A string, a list of strings, a list of token ids, or a list of such lists (checked
    # by `check`: msgspec takes one list type in a union).
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | UnsetType = UNSET
    user: str | UnsetType = UNSET

    @property
    def uses_tools(self) -> bool:  # read by the policy stage
        return False

    def check(self) -> None:
        self.input = _inputs(self.input)  # checked once, into the list form

    @property
    def inputs(self) -> Inputs:
        """The inputs as the provider takes them (the decoder ran `check`)."""
        assert isinstance(self.input, list)
        return self.input


def _prompt(inputs: Inputs, body_bytes: int) -> Prompt:
    """What the gateway counts of the inputs when the upstream's count is missing or broken."""
    text = "".join(item if isinstance(item, str) else _ID_AS_TEXT * len(item) for item in inputs)
    return Prompt(text, body_bytes)


def _vectors(provider: str, answer: JSONObject, count: int) -> list[list[float]]:
    """The answer's vectors in the order of the inputs (by their `index`): one each."""
    data = sorted(answer["data"], key=lambda item: item["index"])
    if [item["index"] for item in data] != list(range(count)):
        raise malformed(provider)
    return [item["embedding"] for item in data]


def _base64(vector: list[float]) -> str:
    """OpenAI's base64 form of a vector: its little-endian float32 values."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


class EmbeddingsHandlers:
    """The embeddings endpoint, served through the chat endpoints' attempt chain and
    timeout (`inference`)."""

    def __init__(self, inference: InferenceHandlers) -> None:
        self.inference = inference

    def routes(self) -> list[Endpoint]:
        return [
            Endpoint(
                "POST",
                "/v1/embeddings",
                "inference",
                self.embeddings,
                decode=decoder(EmbeddingsRequest),
                pricing=EmbeddingsPricing(),
                mode="embedding",
            )
        ]

    async def embeddings(self, ctx: RequestContext) -> Response:
        payload: EmbeddingsRequest = ctx.payload
        inputs = payload.inputs
        prompt = _prompt(inputs, len(ctx.body))
        inference = self.inference

        async def serve(provider: Provider, upstream: str) -> Response:
            return await self._embed(ctx, provider, upstream, inputs, prompt)

        return await attempt_chain(ctx, inference.providers, inference.metrics, serve)

    async def _embed(
        self,
        ctx: RequestContext,
        provider: Provider,
        upstream: str,
        inputs: Inputs,
        prompt: Prompt,
    ) -> Response:
        payload: EmbeddingsRequest = ctx.payload
        body: JSONObject = {"model": upstream, "input": inputs}
        if payload.dimensions is not UNSET:
            body["dimensions"] = payload.dimensions
        if payload.user is not UNSET:
            body["user"] = payload.user
        acceptance = Acceptance()
        call = provider.embeddings(body, acceptance)
        answer = await self.inference._call(ctx, provider, call, acceptance, prompt)
        vectors = _vectors(provider.name, answer, len(inputs))
        # Embeddings have no output: only the input count is the upstream's to report.
        counts = {**reported(answer.get("usage"), CHAT_KEYS), "output_tokens": 0}
        usage, source = billed_usage(counts, prompt, "")
        if payload.encoding_format == "base64":
            embeddings: list[Any] = [_base64(vector) for vector in vectors]
        else:
            embeddings = vectors
        billed = usage["input_tokens"]
        result = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": embedding}
                for i, embedding in enumerate(embeddings)
            ],
            "model": payload.model,  # as the client named it (an alias, maybe)
            "usage": {"prompt_tokens": billed, "total_tokens": billed},
        }
        raw = orjson.dumps(result)
        ctx.billing = Billing("succeeded", usage, hashlib.sha256(raw).hexdigest(), source)
        return Response(raw, media_type=_JSON)
