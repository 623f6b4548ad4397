"""`[ratelimit]`: optional; its url, when set, is a Redis URL."""

from __future__ import annotations

import pytest

from model_gateway.gateway.config import ConfigError, parse_config


def test_unset_means_no_redis():
    config = parse_config("")
    assert config.ratelimit.url is None and config.ratelimit.prefix == "gateway:rl:"


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/2", "rediss://:pw@redis.internal:6380"])
def test_redis_urls_are_accepted(url):
    assert parse_config(f'[ratelimit]\nurl = "{url}"\n').ratelimit.url == url


@pytest.mark.parametrize("url", ["postgresql://db/gw", "http://redis:6379", "127.0.0.1:6379"])
def test_anything_else_stops_the_start_naming_the_key(url):
    with pytest.raises(ConfigError, match=r"redis:// or rediss://.*ratelimit"):
        parse_config(f'[ratelimit]\nurl = "{url}"\n')


def test_an_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown key `ratelimit\.urls`"):
        parse_config('[ratelimit]\nurls = "redis://x"\n')
