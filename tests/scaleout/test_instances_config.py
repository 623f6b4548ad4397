"""`[cluster] lease_s`: 30 s unless set, and positive."""

from __future__ import annotations

import pytest

from model_gateway.gateway.config import ConfigError, parse_config


def test_the_lease_defaults_to_30_seconds_and_may_be_short():
    assert parse_config("").cluster.lease_s == 30
    assert parse_config("[cluster]\nlease_s = 0.5\n").cluster.lease_s == 0.5


@pytest.mark.parametrize("value", ["0", "-1", '"2"'])
def test_a_lease_that_is_not_a_positive_number_stops_the_start(value):
    with pytest.raises(ConfigError, match=r"cluster\.lease_s|lease_s must be positive"):
        parse_config(f"[cluster]\nlease_s = {value}\n")


def test_a_misspelt_key_is_named():
    with pytest.raises(ConfigError, match=r"cluster\.leas"):
        parse_config("[cluster]\nleas = 2\n")
