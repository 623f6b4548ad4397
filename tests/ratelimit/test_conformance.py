"""One contract for the rate limiters (in-process, the workers' shared one, PostgreSQL,
Redis), driven with explicit arrival times: a bucket of `rpm` may spend its whole minute
at once, then gets one request back every 60/rpm seconds, with no second burst at a
boundary; a request takes from all of its buckets or from none; `retry-after` is the
whole seconds until it would pass. The shared ones also hold it for concurrent callers on
several handles (instances, workers), and on their own server's clock."""

from __future__ import annotations

import asyncio
import math
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from tests.ratelimit.limiters import PROPERTY, fresh


def test_a_full_minute_at_once_then_none_at_the_boundary(handles):
    limiter, k = handles.open(), fresh("key")
    run = handles.run
    # A fixed window would reset at 60 s and grant a second full minute.
    assert [run(limiter.take([(k, 60)], 59_900)) for _ in range(61)] == [0] * 60 + [1]
    assert run(limiter.take([(k, 60)], 60_100)) == 1
    assert run(limiter.take([(k, 60)], 60_900)) == 0  # one second frees one request
    assert run(limiter.take([(k, 60)], 60_900)) == 1
    assert run(limiter.take([(k, 60)], 61_000)) == 1  # 0.9 s still to wait: whole seconds


def test_retry_after_counts_the_seconds_until_the_bucket_allows(handles):
    limiter, k = handles.open(), fresh("key")
    run = handles.run
    assert [run(limiter.take([(k, 2)], 0)) for _ in range(3)] == [0, 0, 30]
    assert run(limiter.take([(k, 2)], 29_999)) == 1
    assert run(limiter.take([(k, 2)], 30_000)) == 0  # exactly when retry-after said


def test_a_refused_request_takes_from_none_of_its_buckets(handles):
    limiter = handles.open()
    project, a, b = fresh("prj"), fresh("key"), fresh("key")
    run = handles.run
    assert run(limiter.take([(project, 3), (a, 1)], 0)) == 0
    assert run(limiter.take([(project, 3), (a, 1)], 0)) == 60  # the key's bucket is empty
    assert run(limiter.take([(project, 3), (a, 1)], 0)) == 60  # ... and took no project's
    assert run(limiter.take([(project, 3), (b, 5)], 0)) == 0
    assert run(limiter.take([(project, 3), (b, 5)], 0)) == 0
    assert run(limiter.take([(project, 3), (b, 5)], 0)) == 20  # the project's is empty now
    assert run(limiter.take([(b, 5)], 0)) == 0  # b gave nothing to the refused request


def test_on_its_own_clock(handles):
    """No time given: the server's clock for the shared limiters (the production path)."""
    limiter, k = handles.open(), fresh("key")
    waits = [handles.run(limiter.take([(k, 2)])) for _ in range(3)]
    assert waits[:2] == [0, 0] and waits[2] in (29, 30)


def test_concurrent_callers_on_two_handles_get_exactly_the_limit(handles):
    limiters = [handles.open(), handles.open()]
    k = fresh("key")

    async def burst() -> list[int]:
        calls = [limiters[i % 2].take([(k, 10)], 1_000) for i in range(40)]
        return await asyncio.gather(*calls)

    waits = handles.run(burst())
    assert waits.count(0) == 10
    assert all(wait >= 1 for wait in waits if wait)


class Reference:
    """GCRA in exact fractions of a millisecond: what every limiter must answer."""

    def __init__(self) -> None:
        self.tat: dict[str, Fraction] = {}

    def take(self, buckets: list[tuple[str, int]], now: int) -> int:
        debt = max(
            max(self.tat.get(name, now), now) + Fraction(60_000, rpm) - now - 60_000
            for name, rpm in buckets
        )
        if debt > 0:
            return math.ceil(debt / 1000)
        for name, rpm in buckets:
            self.tat[name] = max(self.tat.get(name, now), now) + Fraction(60_000, rpm)
        return 0


# Any rate: the limiters count in whole numbers, exact whatever the interval.
RPMS = st.integers(1, 300)


@PROPERTY
@given(
    project_rpm=RPMS,
    key_rpms=st.tuples(RPMS, RPMS),
    arrivals=st.lists(st.tuples(st.integers(0, 4_000), st.sampled_from([0, 1])), max_size=120),
)
def test_every_answer_is_the_reference_gcra(handles, project_rpm, key_rpms, arrivals):
    limiter, reference = handles.open(), Reference()
    project, keys = fresh("prj"), (fresh("key"), fresh("key"))
    now = 0
    for gap_ms, which in arrivals:
        now += gap_ms
        buckets = [(project, project_rpm), (keys[which], key_rpms[which])]
        expected = reference.take(buckets, now)
        assert handles.run(limiter.take(buckets, now)) == expected


@PROPERTY
@given(
    rpm=st.integers(1, 120),
    gaps=st.lists(st.integers(0, 5_000), min_size=1, max_size=200),
)
def test_no_span_admits_more_than_the_bound(handles, rpm, gaps):
    """Whatever the rpm (intervals rounded to µs included), the arrivals admitted within
    any span of d seconds number at most rpm + d * rpm / 60."""
    limiter, k = handles.open(), fresh("key")
    admitted, now = [], 0
    for gap in gaps:
        now += gap
        if handles.run(limiter.take([(k, rpm)], now)) == 0:
            admitted.append(now)
    for i, start in enumerate(admitted):
        for j in range(i + rpm, len(admitted)):  # fewer than rpm + 1 is always within
            assert (j - i + 1 - rpm) * 60_000 <= (admitted[j] - start) * rpm
