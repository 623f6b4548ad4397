"""A request's cost by token class and price tier (decisions.md, "Prices, exactly").

Classes: uncached input, cache reads, cache writes (5-minute, and 1-hour when the
upstream reports them apart), output (reasoning included). `input_tokens` counts ALL
input, cache reads and writes included, so uncached input is what remains. A tier prices
the whole request once its input tokens exceed the tier's threshold; a class a tier
leaves unset keeps the model's price, and a class the model leaves unset takes its
default (cache reads and writes: the input price; 1-hour writes: the cache-write price).
Cost = the sum of tokens x price over the classes, rounded up to the micro-unit once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class _Tier(Protocol):
    @property
    def above_input_tokens(self) -> int: ...


class PricedModel(Protocol):
    """What pricing reads of a model: its input and output prices (pipeline.ports.ModelInfo)
    and, when it has them (gateway.config.ModelConfig), the other classes' prices and the
    tiers (`*_price_per_mtok`, `price_tiers`)."""

    @property
    def input_price_per_mtok(self) -> int | None: ...
    @property
    def output_price_per_mtok(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Rates:
    """The price of each class, micro-units per million tokens, as applied."""

    input: int
    cached_input: int
    cache_write: int
    cache_write_1h: int
    output: int

    def as_usage(self) -> dict[str, int]:
        """The prices as a receipt's usage carries them (the config's key names)."""
        return {
            "input_price_per_mtok": self.input,
            "cached_input_price_per_mtok": self.cached_input,
            "cache_write_price_per_mtok": self.cache_write,
            "cache_write_1h_price_per_mtok": self.cache_write_1h,
            "output_price_per_mtok": self.output,
        }


def _tiers(model: PricedModel) -> Sequence[_Tier]:
    tiers: Sequence[_Tier] = getattr(model, "price_tiers", ())
    return tiers


def rates_for(model: PricedModel, input_tokens: int) -> Rates:
    """The prices that apply to a request with `input_tokens` of input (all of it): the
    tier's where it sets them, else the model's; a class neither sets takes its default
    from the prices that apply (in a tier, its own input price)."""
    tier = None
    for candidate in _tiers(model):  # thresholds increase (config checks)
        if input_tokens > candidate.above_input_tokens:
            tier = candidate

    def price(name: str) -> int | None:
        value: int | None = getattr(tier, name) if tier is not None else None
        value = getattr(model, name, None) if value is None else value
        return None if value is None else int(value)  # a plain int (config's are Micros)

    input_price = price("input_price_per_mtok")
    assert input_price is not None  # priced: pricing checks before anything runs
    output_price = price("output_price_per_mtok") or 0  # none: an embedding model
    cached = price("cached_input_price_per_mtok")
    cache_write = price("cache_write_price_per_mtok")
    cache_write = input_price if cache_write is None else cache_write
    one_hour = price("cache_write_1h_price_per_mtok")
    return Rates(
        input=input_price,
        cached_input=input_price if cached is None else cached,
        cache_write=cache_write,
        cache_write_1h=cache_write if one_hour is None else one_hour,
        output=output_price,
    )


def cost_by_class(usage: Mapping[str, int], model: PricedModel) -> tuple[int, Rates]:
    """The request's cost in micro-units (rounded up once) and the prices applied."""
    rates = rates_for(model, usage.get("input_tokens", 0))
    total_input = usage.get("input_tokens", 0)
    cached = min(usage.get("cached_input_tokens", 0), total_input)
    writes = min(usage.get("cache_write_tokens", 0), total_input - cached)
    one_hour = min(usage.get("cache_write_1h_tokens", 0), writes)
    numerator = (
        (total_input - cached - writes) * rates.input
        + cached * rates.cached_input
        + (writes - one_hour) * rates.cache_write
        + one_hour * rates.cache_write_1h
        + usage.get("output_tokens", 0) * rates.output
    )
    return -(-numerator // 1_000_000), rates


def worst_case_rates(model: PricedModel, input_bound: int) -> tuple[int, int]:
    """The highest input-class price and the highest output price of every tier a request
    of at most `input_bound` input tokens could reach: what its hold is priced at."""
    reachable = [rates_for(model, 0)] + [
        rates_for(model, tier.above_input_tokens + 1)
        for tier in _tiers(model)
        if input_bound > tier.above_input_tokens
    ]
    input_price = max(
        max(r.input, r.cached_input, r.cache_write, r.cache_write_1h) for r in reachable
    )
    return input_price, max(r.output for r in reachable)


# The classes every receipt priced by class shows (0 when none), and the suffix of the
# prices applied that its usage carries (Rates.as_usage).
RECEIPT_CLASSES = (
    "input_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "output_tokens",
    "reasoning_tokens",
)
_PRICE = "_price_per_mtok"


def split_usage(usage: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """A receipt's stored usage as its counts (every class when it was priced by class)
    and the prices applied by class ("input", "cached_input", ...; empty: none stored)."""
    prices = {key[: -len(_PRICE)]: value for key, value in usage.items() if key.endswith(_PRICE)}
    counts = {key: value for key, value in usage.items() if not key.endswith(_PRICE)}
    if prices:
        counts = {**dict.fromkeys(RECEIPT_CLASSES, 0), **counts}
    return counts, prices
