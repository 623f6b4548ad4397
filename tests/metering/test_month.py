"""The month a hold and its charge count in: the UTC calendar month, formatted once a month."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from model_gateway.gateway.metering import storage_meter as metering


@pytest.mark.parametrize(
    ("moment", "month"),
    [
        (datetime(2026, 11, 30, 23, 59, 59, 999000, tzinfo=UTC), "2026-11"),
        (datetime(2026, 12, 1, tzinfo=UTC), "2026-12"),
        (datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC), "2026-12"),
        (datetime(2027, 1, 1, 0, 0, 0, 1000, tzinfo=UTC), "2027-01"),
    ],
)
def test_the_cached_month_turns_at_the_utc_month_end(monkeypatch, moment, month):
    monkeypatch.setattr(metering, "_month", ("", 0.0))
    before = datetime(moment.year, moment.month, 1, tzinfo=UTC).timestamp() - 1
    monkeypatch.setattr(metering.time, "time", lambda: before)
    earlier = metering.current_month()
    monkeypatch.setattr(metering.time, "time", lambda: moment.timestamp())
    assert metering.current_month() == month != earlier
