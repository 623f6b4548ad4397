"""What a request may cost at most (reserved before it runs) and what it did cost."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from model_gateway.gateway.metering.class_prices import cost_by_class, worst_case_rates
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


def _priced(model: ModelInfo, *, output: bool = True) -> ModelInfo:
    """The model, once it has the prices the request needs."""
    if model.input_price_per_mtok is None or (output and model.output_price_per_mtok is None):
        # Never run a model for free because its price was left out of the config.
        raise ServiceUnavailable("The model has no price configured on this deployment.")
    return model


def _billed(ctx: RequestContext, model: ModelInfo) -> int:
    """The cost of the usage billed, by class and tier; the prices applied go with the
    usage (`<class>_price_per_mtok`, micro-units), so the receipt shows what was charged."""
    usage = ctx.billing.usage if ctx.billing else {}
    cost, rates = cost_by_class(usage, model)
    if ctx.billing is not None:
        ctx.billing.usage.update(rates.as_usage())
    return cost


class InferencePricing:
    """Chat, Responses and Messages: input by class and output, at the tier the input
    reaches. The hold prices the input bound (the body's bytes) at the highest input-class
    price of any tier it could reach, and the held output at the highest output price."""

    kind = "inference"

    @staticmethod
    def subject(ctx: RequestContext) -> str:
        assert ctx.model_id is not None  # the policy stage resolved it
        return ctx.model_id

    @staticmethod
    def estimate(ctx: RequestContext) -> int:
        assert ctx.model is not None  # the policy stage resolved it
        model = _priced(ctx.model)
        payload: ChatRequest | ResponsesRequest = ctx.payload
        # A token spans at least one byte, so the body's size bounds the prompt's tokens.
        input_tokens = len(ctx.body)
        output_tokens = held_output_tokens(payload.output_limit, model.max_output_tokens)
        input_price, output_price = worst_case_rates(model, input_tokens)
        worst = input_tokens * input_price + output_tokens * output_price
        return -(-worst // 1_000_000)  # rounded up once, as a cost is

    @staticmethod
    def cost(ctx: RequestContext) -> int:
        assert ctx.model is not None  # the policy stage resolved it
        return _billed(ctx, ctx.model)  # priced, or the estimate refused it


class EmbeddingsPricing:
    """Embeddings: input tokens at the model's input price (its tier's); they have no
    output (its price may be left unset)."""

    kind = "inference"
    subject = staticmethod(InferencePricing.subject)

    @staticmethod
    def estimate(ctx: RequestContext) -> int:
        assert ctx.model is not None  # the policy stage resolved it
        model = _priced(ctx.model, output=False)
        # A token spans at least one byte, so the body's size bounds the input's tokens.
        input_price, _ = worst_case_rates(model, len(ctx.body))
        return -(-len(ctx.body) * input_price // 1_000_000)

    @staticmethod
    def cost(ctx: RequestContext) -> int:
        assert ctx.model is not None  # the policy stage resolved it
        return _billed(ctx, ctx.model)


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
