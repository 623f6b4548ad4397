"""What a request may cost at most (reserved before it runs) and what it did cost."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from model_gateway.gateway.metering.money import cost_of_tokens
from model_gateway.pipeline.context import RequestContext
from model_gateway.pipeline.errors import ServiceUnavailable

if TYPE_CHECKING:
    from model_gateway.gateway.inference.schemas import ChatRequest, ResponsesRequest
    from model_gateway.pipeline.ports import ModelInfo

# The tolerance of the gateway's count (bytes / 4) against an upstream's own tokenizer.
_TOLERANCE_NUM, _TOLERANCE_DEN, _TOLERANCE_EXTRA = 5, 4, 16


def output_limit(requested: int | None, model_max: int) -> int:
    """The request's output limit: its own, clamped to the model's (never refused for
    being larger), or the model's when absent."""
    return min(requested or model_max, model_max)


def held_output_tokens(requested: int | None, model_max: int) -> int:
    """The output tokens a request's hold covers."""
    limit = output_limit(requested, model_max)
    return -(-limit * _TOLERANCE_NUM // _TOLERANCE_DEN) + _TOLERANCE_EXTRA


def _priced(price: int | None) -> int:
    if price is None:
        # Never run a model for free because its price was left out of the config.
        raise ServiceUnavailable("The model has no price configured on this deployment.")
    return price


def _prices(model: ModelInfo) -> tuple[int, int]:
    """The model's input and output prices, in micro-units per million tokens."""
    return _priced(model.input_price_per_mtok), _priced(model.output_price_per_mtok)


def _input_price(model: ModelInfo) -> int:
    return _priced(model.input_price_per_mtok)


class InferencePricing:
    kind = "inference"

    @staticmethod
    def subject(ctx: RequestContext) -> str:
        assert ctx.model_id is not None  # the policy stage resolved it
        return ctx.model_id

    @staticmethod
    def estimate(ctx: RequestContext) -> int:
        model = ctx.model
        assert model is not None  # the policy stage resolved it
        input_price, output_price = _prices(model)
        payload: ChatRequest | ResponsesRequest = ctx.payload
        # A token spans at least one byte, so the body's size bounds the prompt's tokens.
        input_tokens = len(ctx.body)
        output_tokens = held_output_tokens(payload.output_limit, model.max_output_tokens)
        return cost_of_tokens(input_tokens, input_price) + cost_of_tokens(
            output_tokens, output_price
        )

    @staticmethod
    def cost(ctx: RequestContext) -> int:
        assert ctx.model is not None  # the policy stage resolved it
        input_price, output_price = _prices(ctx.model)  # priced, or the estimate refused it
        usage = ctx.billing.usage if ctx.billing else {}
        return cost_of_tokens(usage.get("input_tokens", 0), input_price) + cost_of_tokens(
            usage.get("output_tokens", 0), output_price
        )


class EmbeddingsPricing:
    """Embeddings: input tokens at the model's input price; they have no output (its
    price may be left unset)."""

    kind = "inference"
    subject = staticmethod(InferencePricing.subject)

    @staticmethod
    def estimate(ctx: RequestContext) -> int:
        assert ctx.model is not None  # the policy stage resolved it
        # A token spans at least one byte, so the body's size bounds the input's tokens.
        return cost_of_tokens(len(ctx.body), _input_price(ctx.model))

    @staticmethod
    def cost(ctx: RequestContext) -> int:
        assert ctx.model is not None  # the policy stage resolved it
        usage = ctx.billing.usage if ctx.billing else {}
        return cost_of_tokens(usage.get("input_tokens", 0), _input_price(ctx.model))


class _SandboxLimits(Protocol):
    @property
    def timeout_s(self) -> int: ...


class _SandboxRun(Protocol):
    """What `SandboxPricing` reads of its payload (gateway.sandbox.executions.Execution)."""

    @property
    def runtime(self) -> str: ...
    @property
    def sandbox(self) -> _SandboxLimits | None: ...  # read by the endpoint's admit check


class SandboxPricing:
    """A fixed fee per execution plus wall time, in micro-units, rounded up.

    The payload is a `gateway.sandbox.executions.Execution` whose `sandbox` record (read
    by the endpoint's admit check) fixes the timeout, and so the most a run can cost.
    """

    kind = "sandbox"

    def __init__(self, per_execution: int, per_second: int) -> None:
        self.per_execution = per_execution
        self.per_second = per_second

    def hold(self, timeout_s: int) -> int:
        return self.per_execution + self.per_second * timeout_s

    @staticmethod
    def subject(ctx: RequestContext) -> str:
        payload: _SandboxRun = ctx.payload
        return payload.runtime

    def estimate(self, ctx: RequestContext) -> int:
        return self.hold(_timeout_s(ctx))

    def cost(self, ctx: RequestContext) -> int:
        duration_ms = ctx.billing.usage.get("duration_ms", 0) if ctx.billing else 0
        # A timed-out run overshoots its limit by the kill's latency: never bill that.
        duration_ms = min(duration_ms, _timeout_s(ctx) * 1000)
        return self.per_execution + -(-duration_ms * self.per_second // 1000)


def _timeout_s(ctx: RequestContext) -> int:
    payload: _SandboxRun = ctx.payload
    assert payload.sandbox is not None  # read by the endpoint's admit check
    return payload.sandbox.timeout_s
