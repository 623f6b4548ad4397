"""`gateway models prices`: every model's effective prices by class and tier and where each
came from (config, the genai-prices catalog with its version, or the class's default),
run as the installed command against a config whose database nothing could reach."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import genai_prices
import pytest

from model_gateway.gateway.metering.money import format_amount
from model_gateway.gateway.metering.price_catalog import catalog_prices
from tests.support.gateway_process import GATEWAY, free_port

CATALOG_ID = "anthropic/claude-sonnet-4-5"
# Nothing listens there: the command reads the config, never the database.
CONFIG = f"""
[storage]
url = "postgresql://gateway@127.0.0.1:{free_port()}/nowhere"

[providers.local]
kind = "echo"

[models."sonnet"]
provider = "local"
prices = "catalog"
catalog_id = "{CATALOG_ID}"
cached_input_price_per_mtok = "0.25"

[models."tiered"]
provider = "local"
input_price_per_mtok = "1.25"
output_price_per_mtok = "10"
cached_input_price_per_mtok = "0.125"

[[models."tiered".price_tiers]]
above_input_tokens = 200000
input_price_per_mtok = "2.50"
output_price_per_mtok = "15"

[models."embed"]
provider = "local"
mode = "embedding"
input_price_per_mtok = "0.02"
"""
CLASSES = ["input", "cached_input", "cache_write", "cache_write_1h", "output"]


def prices(folder: Path, *flags: str, config: str = CONFIG) -> subprocess.CompletedProcess:
    path = folder / "config.toml"
    path.write_text(config)
    return subprocess.run(
        [GATEWAY, "models", "prices", "--config", str(path), *flags],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
    )


@pytest.fixture(scope="module")
def listing(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("prices")
    done = prices(folder, "--json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1  # one JSON object on one line
    assert sorted(p.name for p in folder.iterdir()) == ["config.toml"]  # no database made
    return json.loads(done.stdout)


def test_the_listing_is_a_list_object_with_the_datasets_version(listing):
    assert listing["object"] == "list"
    assert listing["catalog"] == {"dataset": "genai-prices", "version": genai_prices.__version__}
    assert [m["id"] for m in listing["data"]] == ["sonnet", "tiered", "embed"]
    for model in listing["data"]:
        assert list(model["prices"]) == list(model["sources"]) == CLASSES
        assert model["provider"] == "local"


def test_a_catalog_model_shows_the_catalog_and_its_override(listing):
    sonnet = listing["data"][0]
    base, tiers = catalog_prices(CATALOG_ID)
    assert (sonnet["mode"], sonnet["catalog_id"]) == ("chat", CATALOG_ID)
    for name in CLASSES:
        if name == "cached_input":
            continue
        assert sonnet["prices"][name] == format_amount(base[f"{name}_price_per_mtok"]), name
        assert sonnet["sources"][name] == "catalog", name
    assert sonnet["prices"]["cached_input"] == "0.250000"  # set beside the catalog id
    assert sonnet["sources"]["cached_input"] == "config"
    assert base["cached_input_price_per_mtok"] != 250_000  # so the override shows
    # The dataset's long-context tier, without the class the config overrides.
    assert [t["above_input_tokens"] for t in sonnet["price_tiers"]] == [t for t, _ in tiers]
    tier = sonnet["price_tiers"][0]["prices"]
    assert tier["input"] == format_amount(tiers[0][1]["input_price_per_mtok"])
    assert tier["cached_input"] is None


def test_a_config_model_shows_its_tier_and_the_defaults(listing):
    tiered = listing["data"][1]
    assert tiered["catalog_id"] is None
    assert tiered["prices"] == {
        "input": "1.250000",
        "cached_input": "0.125000",
        "cache_write": None,
        "cache_write_1h": None,
        "output": "10.000000",
    }
    assert tiered["sources"] == {
        "input": "config",
        "cached_input": "config",
        "cache_write": "default",
        "cache_write_1h": "default",
        "output": "config",
    }
    assert tiered["price_tiers"] == [
        {
            "above_input_tokens": 200_000,
            "prices": {
                "input": "2.500000",
                "cached_input": None,
                "cache_write": None,
                "cache_write_1h": None,
                "output": "15.000000",
            },
        }
    ]


def test_an_embedding_model_has_an_input_price_only(listing):
    embed = listing["data"][2]
    assert embed["mode"] == "embedding" and embed["price_tiers"] == []
    assert embed["prices"]["input"] == "0.020000" and embed["prices"]["output"] is None
    assert embed["sources"] == {"input": "config", **dict.fromkeys(CLASSES[1:], "default")}


def test_the_text_lists_each_class_with_its_source(tmp_path):
    done = prices(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    version = genai_prices.__version__
    assert lines[0] == f"USD per million tokens; price catalog: genai-prices {version}"
    blocks = {}
    for line in lines[1:]:
        if not line.startswith(" "):
            current = blocks.setdefault(line, [])
        else:
            current.append(line.split())
    assert list(blocks) == [
        f"sonnet (local, chat): catalog {CATALOG_ID}",
        "tiered (local, chat): config",
        "embed (local, embedding): config",
    ]
    sonnet, tiered, embed = blocks.values()
    assert sonnet[1] == ["cached_input", "$0.250000", "per", "MTok", "(config)"]
    assert [row[-1] for row in sonnet[:5]] == ["(catalog)", "(config)"] + ["(catalog)"] * 3
    assert tiered[2] == ["cache_write", "the", "input", "price", "(default)"]
    assert tiered[5] == "above 200000 input tokens: input $2.500000, output $15.000000".split()
    assert embed[4] == ["output", "none:", "embeddings", "bill", "input", "only", "(default)"]


def test_an_unknown_catalog_id_is_a_config_error_naming_it(tmp_path):
    config = CONFIG.replace(CATALOG_ID, "anthropic/no-such-model")
    done = prices(tmp_path, "--json", config=config)
    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert error["type"] == "invalid_request" and "anthropic/no-such-model" in error["message"]
