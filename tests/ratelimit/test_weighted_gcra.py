"""The in-process limiter's weighted GCRA, by its properties (many examples: it is fast).

Tokens admitted within any span of d milliseconds never exceed a minute's tokens (the
burst) plus what refills in d: tpm + d * tpm / 60000. A request that gives back what it
did not use, before the next one arrives, counts as if it had taken only what it used:
the bound holds for what requests used. And a give-back restores capacity exactly: a
limiter that took w and later gave back r answers every later request as one that took
w - r in the first place (nothing at all when r = w). Every answer is exact, to the
millisecond: that of GCRA computed in fractions (tests/ratelimit/limiters.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from model_gateway.pipeline.gcra import Gcra
from model_gateway.pipeline.rate_limit import unused
from tests.ratelimit.limiters import GAPS, Reference, arrival


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@settings(max_examples=200)
@given(tpm=st.integers(1, 100_000), data=st.data())
def test_every_answer_is_the_reference_to_the_millisecond(tpm, data):
    clock, reference = Clock(), Reference()
    limiter = Gcra(clock)
    for _ in range(data.draw(st.integers(1, 40))):
        buckets = [("k", tpm, data.draw(st.integers(1, tpm)))]
        clock.now = data.draw(arrival(reference, buckets, clock.now))
        expected = reference.take(buckets, clock.now)
        assert tuple(limiter.take(buckets)) == expected
        back = data.draw(st.integers(-tpm, tpm))
        if back and expected[0] == 0:
            clock.now += data.draw(GAPS)
            given = [("k", tpm, min(back, buckets[0][2]))]
            reference.give(given, clock.now)
            limiter.give(given)


def _within_the_bound(admitted: list[tuple[int, int]], tpm: int) -> None:
    """Every span [start, end] of (time, tokens) admissions holds at most tpm plus what
    refills in it, in whole numbers."""
    for i, (start, _) in enumerate(admitted):
        tokens = 0
        for end, units in admitted[i:]:
            tokens += units
            assert (tokens - tpm) * 60_000 <= (end - start) * tpm


@given(tpm=st.integers(1, 100_000), data=st.data())
def test_no_span_admits_more_tokens_than_a_minute_and_its_refill(tpm, data):
    clock, timing = Clock(), Reference()  # the reference only picks edgy arrival times
    limiter = Gcra(clock)
    admitted = []
    for _ in range(data.draw(st.integers(1, 80))):
        bucket = [("k", tpm, data.draw(st.integers(1, tpm)))]
        clock.now = data.draw(arrival(timing, bucket, clock.now))
        if limiter.take(bucket).wait_s == 0:
            timing.take(bucket, clock.now)
            admitted.append((clock.now, bucket[0][2]))
    _within_the_bound(admitted, tpm)


@given(tpm=st.integers(1, 100_000), data=st.data())
def test_what_requests_used_stays_within_the_bound_when_each_settles(tpm, data):
    """Each request settles before the next one arrives, giving back what it did not use."""
    clock, timing = Clock(), Reference()
    limiter = Gcra(clock)
    used_by_admitted = []
    for _ in range(data.draw(st.integers(1, 80))):
        units = data.draw(st.integers(1, tpm))
        clock.now = data.draw(arrival(timing, [("k", tpm, units)], clock.now))
        if limiter.take([("k", tpm, units)]).wait_s:
            continue
        timing.take([("k", tpm, units)], clock.now)
        used = data.draw(st.integers(0, units))
        used_by_admitted.append((clock.now, used))
        clock.now += data.draw(GAPS)
        limiter.give([("k", tpm, units - used)])
        timing.give([("k", tpm, units - used)], clock.now)
    _within_the_bound(used_by_admitted, tpm)


Arrivals = st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 10_000)), max_size=40)


@given(
    tpm=st.integers(1, 10_000),
    before=Arrivals,
    taken=st.integers(1, 10_000),
    given_back=st.integers(0, 10_000),
    settles_after=st.integers(0, 100_000),
    after=Arrivals,
)
def test_a_give_back_restores_capacity_exactly(
    tpm, before, taken, given_back, settles_after, after
):
    clocks = Clock(), Clock()
    settled, netted = Gcra(clocks[0]), Gcra(clocks[1])

    def both(gap: int, units: int) -> tuple[int, int]:
        for clock in clocks:
            clock.now += gap
        bucket = [("k", tpm, min(units, tpm))]
        return settled.take(bucket).wait_s, netted.take(bucket).wait_s

    for gap, units in before:
        first, second = both(gap, units)
        assert first == second
    units = min(taken, tpm)
    back = min(given_back, units)
    if settled.take([("k", tpm, units)]).wait_s == 0:
        # One took it all and gives back later; the other took only what was used.
        assert netted.take([("k", tpm, units - back)]).wait_s == 0
        clocks[0].now += settles_after
        settled.give([("k", tpm, back)])
        clocks[1].now += settles_after
    for gap, units in after:
        first, second = both(gap, units)
        assert first == second


def test_a_give_back_never_returns_what_its_take_already_drained():
    """A request that held its take a whole minute has nothing left to return: giving its
    take back anyway would admit twice the limit at once (a review's finding)."""
    now = [0]
    limiter = Gcra(lambda: now[0])
    take = [("tpm:k", 1000, 1000)]
    assert limiter.take(take).wait_s == 0  # A: a whole minute's tokens, streams a minute
    now[0] = 60_000
    assert limiter.take(take).wait_s == 0  # B: the bucket refilled meanwhile
    limiter.give(unused(take, used=0, elapsed_s=60.0))  # A fails having used nothing
    assert limiter.take(take).wait_s > 0  # C: no room, as without A's give-back
    # Within its minute, what is left of a take goes back; usage past it is taken.
    assert unused(take, used=100, elapsed_s=0.0) == [("tpm:k", 1000, 900)]
    assert unused(take, used=100, elapsed_s=30.0) == [("tpm:k", 1000, 500)]
    assert unused(take, used=1200, elapsed_s=30.0) == [("tpm:k", 1000, -200)]
    assert unused(take, used=1000, elapsed_s=1.0) == []
