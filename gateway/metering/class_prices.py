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


class _Prices(Protocol):
    @property
    def input_price_per_mtok(self) -> int | None: ...
    @property
    def output_price_per_mtok(self) -> int | None: ...
    @property
    def cached_input_price_per_mtok(self) -> int | None: ...
    @property
    def cache_write_price_per_mtok(self) -> int | None: ...
    @property
    def cache_write_1h_price_per_mtok(self) -> int | None: ...


class _Tier(_Prices, Protocol):
    @property
    def above_input_tokens(self) -> int: ...


class PricedModel(_Prices, Protocol):
    """What pricing reads of a model (gateway.config.ModelConfig)."""

    @property
    def price_tiers(self) -> Sequence[_Tier]: ...


@dataclass(frozen=True, slots=True)
class Rates:
    """The price of each class, micro-units per million tokens, as applied."""

    input: int
    cached_input: int
    cache_write: int
    cache_write_1h: int
    output: int

    def as_dict(self) -> dict[str, int]:
        return {
            "input": self.input,
            "cached_input": self.cached_input,
            "cache_write": self.cache_write,
            "cache_write_1h": self.cache_write_1h,
            "output": self.output,
        }


def rates_for(model: PricedModel, input_tokens: int) -> Rates:
    """The prices that apply to a request with `input_tokens` of input (all of it): the
    tier's where it sets them, else the model's; a class neither sets takes its default
    from the prices that apply (in a tier, its own input price)."""
    tier = None
    for candidate in model.price_tiers:  # thresholds increase (config checks)
        if input_tokens > candidate.above_input_tokens:
            tier = candidate

    def price(name: str) -> int | None:
        value: int | None = getattr(tier, name) if tier is not None else None
        return getattr(model, name) if value is None else value

    input_price, output_price = price("input_price_per_mtok"), price("output_price_per_mtok")
    assert input_price is not None and output_price is not None  # priced: pricing checks
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
        for tier in model.price_tiers
        if input_bound > tier.above_input_tokens
    ]
    input_price = max(
        max(r.input, r.cached_input, r.cache_write, r.cache_write_1h) for r in reachable
    )
    return input_price, max(r.output for r in reachable)
