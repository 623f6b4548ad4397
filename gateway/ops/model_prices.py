"""`gateway models prices`: every model's effective prices, by class and tier, and where
each came from: the config file, or the genai-prices catalog (with the dataset's version).
It reads the config, never the database.

Prices are USD per million tokens, as decimal strings (the config's own notation).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TypeVar

import orjson

from model_gateway.gateway.config import ClassPrices, Config, ModelConfig
from model_gateway.gateway.metering import price_catalog
from model_gateway.gateway.metering.money import format_amount
from model_gateway.gateway.ops.terminal import escape

# The CLI's parser class: its subparsers and their parents are of that class.
_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)

CLASSES = (
    ("input", "input_price_per_mtok"),
    ("cached_input", "cached_input_price_per_mtok"),
    ("cache_write", "cache_write_price_per_mtok"),
    ("cache_write_1h", "cache_write_1h_price_per_mtok"),
    ("output", "output_price_per_mtok"),
)


def _prices(prices: ClassPrices) -> dict[str, str | None]:
    """Each class's price as set (None: the class's default applies)."""
    return {
        name: None if getattr(prices, key) is None else format_amount(getattr(prices, key))
        for name, key in CLASSES
    }


def _catalog_base(model: ModelConfig) -> dict[str, int]:
    assert model.catalog_id is not None
    return price_catalog.catalog_prices(model.catalog_id)[0]


def _sources(model: ModelConfig) -> dict[str, str]:
    """Where each class's price came from: "config", "catalog" or "default". The loaded
    config no longer tells which keys were set beside the catalog id: a key set to the
    catalog's own price reads as "catalog" (the price is the same)."""
    catalog = _catalog_base(model) if model.prices == "catalog" else {}
    sources = {}
    for name, key in CLASSES:
        value = getattr(model, key)
        if value is None:
            sources[name] = "default"
        elif catalog.get(key) == value:
            sources[name] = "catalog"
        else:
            sources[name] = "config"
    return sources


def model_prices(config: Config) -> dict[str, Any]:
    """The list object `--json` prints."""
    data = []
    for model_id, model in config.models.items():
        entry: dict[str, Any] = {
            "id": model_id,
            "provider": model.provider,
            "mode": model.mode,
            "prices": _prices(model),
            "sources": _sources(model),
            "price_tiers": [
                {"above_input_tokens": tier.above_input_tokens, "prices": _prices(tier)}
                for tier in model.price_tiers
            ],
            "catalog_id": model.catalog_id,
        }
        data.append(entry)
    # The installed dataset, whether or not a model takes its prices from it.
    catalog = {"dataset": "genai-prices", "version": price_catalog.dataset_version()}
    return {"object": "list", "data": data, "catalog": catalog}


# What an unset class costs (config.ClassPrices; gateway.metering.class_prices).
_DEFAULTS = {
    "input": "not priced: requests answer 503",
    "output": "not priced: requests answer 503",
    "cached_input": "the input price",
    "cache_write": "the input price",
    "cache_write_1h": "the cache_write price",
}
_EMBEDDING_OUTPUT = "none: embeddings bill input only"


def render_text(listing: dict[str, Any]) -> str:
    """A few lines per model: its price per class (and where it came from), its tiers."""
    version = listing["catalog"]["version"]
    lines = [f"USD per million tokens; price catalog: genai-prices {version}"]
    for entry in listing["data"]:
        catalog_id = entry["catalog_id"]
        where = f"catalog {catalog_id}" if catalog_id else "config"
        lines.append(f"{entry['id']} ({entry['provider']}, {entry['mode']}): {where}")
        embeds = entry["mode"] == "embedding"
        for name, _ in CLASSES:
            value = entry["prices"][name]
            unset = _EMBEDDING_OUTPUT if embeds and name == "output" else _DEFAULTS[name]
            shown = f"${value} per MTok" if value is not None else unset
            lines.append(f"  {name:<15} {shown} ({entry['sources'][name]})")
        for tier in entry["price_tiers"]:
            prices = ", ".join(f"{k} ${v}" for k, v in tier["prices"].items() if v is not None)
            lines.append(f"  above {tier['above_input_tokens']} input tokens: {prices}")
    # One line per field: a name from the config cannot start a line of its own.
    return "\n".join(escape(line) for line in lines)


def add_parser(commands: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    models = commands.add_parser("models", help="the configured models")
    actions = models.add_subparsers(dest="action", required=True)
    p = actions.add_parser("prices", parents=[common], help="every model's prices and sources")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, config: Config) -> int:
    listing = model_prices(config)
    if args.json:
        sys.stdout.write(orjson.dumps(listing).decode() + "\n")
    else:
        print(render_text(listing))
    return 0
