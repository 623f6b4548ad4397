"""The workers' shared table with no room for a take's second new bucket: the take is
refused whole (503), and its first bucket, already written, is put back as it was."""

from __future__ import annotations

import pytest

from model_gateway.gateway.ratelimit import shared_gcra
from model_gateway.gateway.ratelimit.shared_gcra import SharedGcra, create_table
from model_gateway.pipeline.errors import ServiceUnavailable
from model_gateway.pipeline.ports import ADMITTED


@pytest.fixture
def tiny_table(tmp_path, monkeypatch):
    # Four slots, each a probe of every bucket's home: the fourth bucket fills the table.
    monkeypatch.setattr(shared_gcra, "SLOTS", 4)
    monkeypatch.setattr(shared_gcra, "PROBES", 4)
    path = tmp_path / "buckets"
    create_table(path)
    return SharedGcra(path, clock=lambda: 1_000_000)


def test_a_take_refused_for_room_charges_none_of_its_buckets(tiny_table):
    for name in ("held-1", "held-2", "held-3"):  # 1 rpm: each stays a minute
        assert tiny_table.take([(name, 1, 1)]) == ADMITTED
    with pytest.raises(ServiceUnavailable):
        tiny_table.take([("a", 1, 1), ("b", 1, 1)])  # "a" finds the last slot, "b" none
    # "a" took nothing: its 1 rpm is all there.
    assert tiny_table.take([("a", 1, 1)]) == ADMITTED
    assert tiny_table.take([("a", 1, 1)]).wait_s > 0
