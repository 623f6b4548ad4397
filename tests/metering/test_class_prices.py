"""Cost by token class and tier: the exact decimal sum rounded up once, and the catalog's
prices priced as the genai-prices dataset prices them itself."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal

import pytest
from genai_prices import Usage, calc_price
from hypothesis import given, settings
from hypothesis import strategies as st

from model_gateway.gateway.config import ConfigError, parse_config
from model_gateway.gateway.metering.class_prices import (
    cost_by_class,
    rates_for,
    worst_case_rates,
)

PRICE = st.integers(min_value=0, max_value=200_000_000)  # up to $200 per million tokens
OPTIONAL_PRICE = st.none() | PRICE
KEYS = (
    "cached_input_price_per_mtok",
    "cache_write_price_per_mtok",
    "cache_write_1h_price_per_mtok",
)


def _toml_prices(prices: dict[str, int | None]) -> str:
    # Micro-units as decimal strings of USD, as an operator writes them.
    return "".join(
        f'{key} = "{Decimal(value) / 1_000_000}"\n'
        for key, value in prices.items()
        if value is not None
    )


@st.composite
def priced_models(draw):
    base = {"input_price_per_mtok": draw(PRICE), "output_price_per_mtok": draw(PRICE)}
    base |= {key: draw(OPTIONAL_PRICE) for key in KEYS}
    thresholds = sorted(draw(st.sets(st.integers(1, 400_000), max_size=3)))
    tiers = []
    for threshold in thresholds:
        keys = ("input_price_per_mtok", "output_price_per_mtok", *KEYS)
        tiers.append((threshold, {key: draw(OPTIONAL_PRICE) for key in keys}))
    text = '[providers.p]\nkind = "echo"\n[models.m]\nprovider = "p"\n' + _toml_prices(base)
    for threshold, prices in tiers:
        text += f"[[models.m.price_tiers]]\nabove_input_tokens = {threshold}\n"
        text += _toml_prices(prices)
    return parse_config(text).models["m"], base, tiers


@st.composite
def usages(draw):
    total = draw(st.integers(0, 1_000_000))
    cached = draw(st.integers(0, total))
    writes = draw(st.integers(0, total - cached))
    return {
        "input_tokens": total,
        "cached_input_tokens": cached,
        "cache_write_tokens": writes,
        "cache_write_1h_tokens": draw(st.integers(0, writes)),
        "output_tokens": draw(st.integers(0, 200_000)),
    }


def _expected(usage, base, tiers) -> int:
    """The spec's sum, computed independently: pick the tier, default each class."""
    chosen = {}
    for threshold, prices in tiers:
        if usage["input_tokens"] > threshold:
            chosen = prices

    def price(key, default):
        for source in (chosen, base):
            if source.get(key) is not None:
                return Decimal(source[key])
        return default

    input_price = price("input_price_per_mtok", None)
    write = price("cache_write_price_per_mtok", input_price)
    total = (
        (usage["input_tokens"] - usage["cached_input_tokens"] - usage["cache_write_tokens"])
        * input_price
        + usage["cached_input_tokens"] * price("cached_input_price_per_mtok", input_price)
        + (usage["cache_write_tokens"] - usage["cache_write_1h_tokens"]) * write
        + usage["cache_write_1h_tokens"] * price("cache_write_1h_price_per_mtok", write)
        + usage["output_tokens"] * price("output_price_per_mtok", None)
    ) / Decimal(1_000_000)
    return int(total.to_integral_value(rounding=ROUND_CEILING))


@settings(max_examples=300, deadline=None)
@given(priced_models(), usages())
def test_cost_is_the_exact_sum_of_the_classes_rounded_up_once(priced, usage):
    model, base, tiers = priced
    cost, _ = cost_by_class(usage, model)
    assert cost == _expected(usage, base, tiers)
    assert cost >= 0


@settings(max_examples=300, deadline=None)
@given(priced_models(), usages())
def test_the_worst_case_prices_cover_every_reachable_tier(priced, usage):
    """A hold priced at the worst case covers any usage within its input bound."""
    model, _, _ = priced
    input_price, output_price = worst_case_rates(model, usage["input_tokens"])
    worst = usage["input_tokens"] * input_price + usage["output_tokens"] * output_price
    hold = -(-worst // 10**6)
    assert cost_by_class(usage, model)[0] <= hold


def test_a_tier_prices_the_whole_request_above_its_threshold():
    model = parse_config(
        '[providers.p]\nkind = "echo"\n[models.m]\nprovider = "p"\n'
        'input_price_per_mtok = "1"\noutput_price_per_mtok = "2"\n'
        '[[models.m.price_tiers]]\nabove_input_tokens = 100\ninput_price_per_mtok = "3"\n'
    ).models["m"]
    assert rates_for(model, 100).input == 1_000_000  # "exceed": not at the threshold
    assert rates_for(model, 101).input == 3_000_000
    assert rates_for(model, 101).output == 2_000_000  # unset in the tier: the model's
    assert cost_by_class({"input_tokens": 101, "output_tokens": 0}, model)[0] == 303


# Catalog models whose every price is a whole micro-unit per million tokens (about 1% are
# finer, and are rounded up: docs/money.md), with tiers and cache prices among them.
CATALOG_IDS = [
    "anthropic/claude-sonnet-4-5",
    "anthropic/claude-haiku-4-5",
    "anthropic/claude-opus-4-1",
    "google/gemini-2.5-pro",
    "google/gemini-2.5-flash",
    "openai/gpt-4o-mini",
    "openai/gpt-5",
    "mistral/mistral-large-2512",
]


def _catalog_model(catalog_id: str):
    return parse_config(
        '[providers.p]\nkind = "echo"\n[models.m]\nprovider = "p"\n'
        f'prices = "catalog"\ncatalog_id = "{catalog_id}"\n'
    ).models["m"]


@pytest.mark.parametrize("catalog_id", CATALOG_IDS)
@settings(max_examples=60, deadline=None)
@given(usage=usages())
def test_the_catalogs_price_is_the_datasets_own_calculation(catalog_id, usage):
    model = _catalog_model(catalog_id)
    provider_id, _, model_ref = catalog_id.partition("/")
    theirs = calc_price(
        Usage(
            input_tokens=usage["input_tokens"],
            cache_read_tokens=usage["cached_input_tokens"],
            cache_write_tokens=usage["cache_write_tokens"],
            cache_write_1h_tokens=usage["cache_write_1h_tokens"],
            output_tokens=usage["output_tokens"],
        ),
        model_ref,
        provider_id=provider_id,
    ).total_price
    # Their prices for web searches and the like apply to counts the usage does not have.
    expected = int((theirs * 1_000_000).to_integral_value(rounding=ROUND_CEILING))
    assert cost_by_class(usage, model)[0] == expected


@pytest.mark.parametrize("catalog_id", ["deepseek/deepseek-v4-pro", "deepseek/deepseek-chat"])
def test_a_price_by_time_of_day_is_the_highest_at_every_hour(catalog_id):
    """The dataset prices some models by hour (peak and off-peak); a price fixed at start
    is the highest of the hours' and the date-ruled one, never below what the vendor
    charges at some hour (a review found the last one listed applied, by accident)."""
    import datetime

    from genai_prices import data_snapshot

    provider_id, _, ref = catalog_id.partition("/")
    provider = next(p for p in data_snapshot.get_snapshot().providers if p.id == provider_id)
    entries = next(m for m in provider.models if m.id == ref).prices
    assert any(hasattr(e.constraint, "start_time") for e in entries), "no hourly price left"
    in_force = [
        e.prices
        for e in entries
        if getattr(e.constraint, "start_date", datetime.date.min) <= datetime.date.today()
    ]
    model = _catalog_model(catalog_id)
    for key, theirs in (
        ("input_price_per_mtok", "input_mtok"),
        ("output_price_per_mtok", "output_mtok"),
    ):
        highest = max(getattr(p, theirs) for p in in_force)
        assert getattr(model, key) == int(highest * 1_000_000)


def test_price_keys_beside_the_catalog_override_their_class():
    model = parse_config(
        '[providers.p]\nkind = "echo"\n[models.m]\nprovider = "p"\n'
        'prices = "catalog"\ncatalog_id = "anthropic/claude-sonnet-4-5"\n'
        'cached_input_price_per_mtok = "0.10"\n'
    ).models["m"]
    assert model.input_price_per_mtok == 3_000_000
    assert model.cached_input_price_per_mtok == 100_000
    # The override holds in the long-context tier too; the others follow the dataset.
    assert rates_for(model, 250_000).cached_input == 100_000
    assert rates_for(model, 250_000).input == 6_000_000


@pytest.mark.parametrize(
    ("block", "named"),
    [
        ('prices = "catalog"\ncatalog_id = "anthropic/claude-none-9"', "claude-none-9"),
        ('prices = "catalog"\ncatalog_id = "nobody/model"', "nobody/model"),
        ('prices = "catalog"', "catalog_id"),
        ('catalog_id = "anthropic/claude-sonnet-4-5"', "catalog_id"),
    ],
)
def test_a_catalog_id_the_dataset_does_not_know_stops_the_start(block, named):
    with pytest.raises(ConfigError) as caught:
        parse_config(f'[providers.p]\nkind = "echo"\n[models.m]\nprovider = "p"\n{block}\n')
    assert named in str(caught.value) and "models.m" in str(caught.value)


def test_tiers_must_increase():
    with pytest.raises(ConfigError, match="price_tiers"):
        parse_config(
            '[providers.p]\nkind = "echo"\n[models.m]\nprovider = "p"\n'
            "[[models.m.price_tiers]]\nabove_input_tokens = 200\n"
            "[[models.m.price_tiers]]\nabove_input_tokens = 100\n"
        )
