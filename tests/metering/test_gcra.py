"""The rate limiter never grants a burst at a window boundary: whatever the arrival times,
any span of `d` seconds admits at most rpm + d * rpm / 60 requests (GCRA's bound)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from model_gateway.pipeline.gcra import Gcra


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_full_minute_spent_at_a_boundary_is_not_granted_again():
    clock = Clock()
    limiter = Gcra(clock)
    clock.now = 59.9  # a fixed window would reset at 60
    assert sum(limiter.take([("k", 60)]) == 0 for _ in range(60)) == 60
    clock.now = 60.1
    assert sum(limiter.take([("k", 60)]) == 0 for _ in range(60)) == 0
    assert limiter.take([("k", 60)]) == 1  # one more second frees one request


@given(
    rpm=st.integers(1, 120),
    gaps=st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=300),
)
def test_no_span_admits_more_than_the_bound(rpm, gaps):
    clock = Clock()
    limiter = Gcra(clock)
    admitted = []
    for gap in gaps:
        clock.now += gap
        if limiter.take([("k", rpm)]) == 0:
            admitted.append(clock.now)
    interval = 60 / rpm
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            span = admitted[j] - start
            assert j - i + 1 <= rpm + span / interval + 1e-6
