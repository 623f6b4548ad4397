"""Model prices from the `genai-prices` dataset (PyPI, MIT; pydantic's maintained catalog).

`prices = "catalog"` with `catalog_id = "provider/model"` (the dataset's provider id and
model ref) takes a model's prices from the snapshot that ships with the installed
package: offline, never fetched at run time, updated with the package's version. The
dataset is imported only when a model asks for it (a quarter of a second).

Prices come back in the config's own terms: micro-units per million tokens by class,
and the tiers (the dataset's `TieredPrices`: crossing a threshold of input tokens prices
every token of the request at the tier's rate, as the gateway's `price_tiers` do). The
dataset's prices for classes the gateway does not count (audio, images, web searches)
are not applied.
"""

from __future__ import annotations

import datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any

# The dataset's price key for each of the gateway's price keys.
CLASS_KEYS = {
    "input_price_per_mtok": "input_mtok",
    "output_price_per_mtok": "output_mtok",
    "cached_input_price_per_mtok": "cache_read_mtok",
    "cache_write_price_per_mtok": "cache_write_mtok",
    "cache_write_1h_price_per_mtok": "cache_write_1h_mtok",
}

Prices = dict[str, int]  # the gateway's price key -> micro-units per million tokens


class UnknownCatalogId(ValueError):
    pass


def dataset_version() -> str:
    import genai_prices

    version: str = genai_prices.__version__
    return version


def _micros(usd_per_mtok: Decimal) -> int:
    """Micro-units per million tokens, rounded up: about 1% of the dataset's prices are
    finer than that (fractions of a micro-unit per million tokens), and a price is
    never rounded below the dataset's."""
    return int((usd_per_mtok * 1_000_000).to_integral_value(rounding=ROUND_CEILING))


def _in_force(model: Any) -> list[Any]:
    """The model's prices in force today, the date-ruled one first: the dataset lists
    prices by start date, and some by time of day (peak and off-peak hours), which a
    price fixed at start cannot follow. Each class is then priced at the highest of them
    (`catalog_prices`): never below what the vendor charges at any hour."""
    prices = model.prices
    if not isinstance(prices, list):
        return [prices]
    today = datetime.date.today()
    dated, by_hour = None, []
    for conditional in prices:
        constraint = conditional.constraint
        if constraint is None or getattr(constraint, "start_date", today) <= today:
            if hasattr(constraint, "start_time"):
                by_hour.append(conditional.prices)
            else:
                dated = conditional.prices
    return [dated, *by_hour] if dated is not None else []


def catalog_prices(catalog_id: str) -> tuple[Prices, list[tuple[int, Prices]]]:
    """The base prices and the tiers (threshold, prices) of `catalog_id`."""
    from genai_prices import data_snapshot
    from genai_prices.types import TieredPrices

    provider_id, _, model_ref = catalog_id.partition("/")
    snapshot = data_snapshot.get_snapshot()
    provider = next((p for p in snapshot.providers if p.id == provider_id), None)
    model = None
    if provider is not None and model_ref:
        model = next((m for m in provider.models if m.id == model_ref), None)
    in_force = _in_force(model) if model is not None else []
    if not in_force:
        message = f"catalog_id {catalog_id!r} is not in the genai-prices dataset"
        raise UnknownCatalogId(f"{message} (version {dataset_version()})")
    base: Prices = {}
    tiers: dict[int, Prices] = {}
    for ours, theirs in CLASS_KEYS.items():
        value = getattr(in_force[0], theirs, None)
        if isinstance(value, TieredPrices):
            base[ours] = _micros(value.base)
            for tier in value.tiers:
                tiers.setdefault(tier.start, {})[ours] = _micros(tier.price)
            continue
        values = [getattr(price, theirs, None) for price in in_force]
        flat = [v for v in values if v is not None and not isinstance(v, TieredPrices)]
        if flat:
            base[ours] = _micros(max(flat))
    return base, sorted(tiers.items())
