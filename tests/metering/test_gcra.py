"""The rate limiter never grants a burst at a window boundary: whatever the arrival times,
any span of `d` seconds admits at most rpm + d * rpm / 60 requests (GCRA's bound). The
in-process limiter's clock is whole milliseconds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from model_gateway.pipeline.gcra import Gcra


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_a_full_minute_spent_at_a_boundary_is_not_granted_again():
    clock = Clock()
    limiter = Gcra(clock)
    clock.now = 59_900  # a fixed window would reset at 60 s
    assert sum(limiter.take([("k", 60, 1)]).wait_s == 0 for _ in range(60)) == 60
    clock.now = 60_100
    assert sum(limiter.take([("k", 60, 1)]).wait_s == 0 for _ in range(60)) == 0
    assert limiter.take([("k", 60, 1)]).wait_s == 1  # one more second frees one request


@given(
    rpm=st.integers(1, 120),
    gaps=st.lists(st.integers(0, 5_000), min_size=1, max_size=300),
)
def test_no_span_admits_more_than_the_bound(rpm, gaps):
    clock = Clock()
    limiter = Gcra(clock)
    admitted = []
    for gap in gaps:
        clock.now += gap
        if limiter.take([("k", rpm, 1)]).wait_s == 0:
            admitted.append(clock.now)
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            span_ms = admitted[j] - start
            assert (j - i + 1 - rpm) * 60_000 <= span_ms * rpm  # exact: whole numbers
