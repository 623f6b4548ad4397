"""Weighted takes and give-backs, one contract for the four limiters (in-process, workers',
PostgreSQL, Redis), driven with explicit arrival times: a bucket of `per_minute` tokens may
spend a whole minute's tokens at once and gets them back continuously, `per_minute` a
minute; a take of `units` goes into all of a request's buckets or none, and the refusal
names the bucket that waits longest; a give-back returns units at once, never beyond a
full bucket, and a negative one takes units whatever the bucket holds."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from tests.ratelimit.limiters import GAPS, PROPERTY, Reference, arrival, fresh


def test_a_minute_of_tokens_at_once_then_they_come_back_continuously(handles):
    limiter, k = handles.open(), fresh("tpm")
    run = handles.run
    assert run(limiter.take([(k, 1000, 600)], 0)) == 0
    assert run(limiter.take([(k, 1000, 400)], 0)) == 0
    assert run(limiter.take([(k, 1000, 1)], 0)) == 1  # one token: 60 ms away
    assert run(limiter.take([(k, 1000, 100)], 5_999)) == 1  # 99.98 tokens back
    assert run(limiter.take([(k, 1000, 100)], 6_000)) == 0  # 6 s: 100 tokens back
    assert run(limiter.take([(k, 1000, 1)], 6_000)) == 1


def test_retry_after_is_the_seconds_until_the_tokens_are_back(handles):
    limiter, k = handles.open(), fresh("tpm")
    run = handles.run
    assert run(limiter.take([(k, 600, 600)], 0)) == 0
    assert run(limiter.take([(k, 600, 300)], 0)) == 30  # 10 tokens a second
    assert run(limiter.take([(k, 600, 300)], 29_999)) == 1
    assert run(limiter.take([(k, 600, 300)], 30_000)) == 0  # exactly when retry-after said


def test_the_refusal_names_the_bucket_that_waits_longest(handles):
    limiter = handles.open()
    a, b, c, tokens = fresh("rpm"), fresh("rpm"), fresh("rpm"), fresh("tpm")
    run = handles.run
    assert run(limiter.verdict([(a, 10, 1), (tokens, 100, 60)], 0)) == (0, -1)
    # 20 tokens short: 12 s; the rpm bucket has room.
    assert run(limiter.verdict([(a, 10, 1), (tokens, 100, 60)], 0)) == (12, 1)
    for spent in (b, c):
        assert run(limiter.verdict([(spent, 1, 1)], 0)) == (0, -1)
    # b waits a minute, longer than the tokens; of equal waits, the first is named.
    assert run(limiter.verdict([(a, 10, 1), (b, 1, 1), (tokens, 100, 60)], 0)) == (60, 1)
    assert run(limiter.verdict([(c, 1, 1), (b, 1, 1)], 0)) == (60, 0)


def test_given_back_tokens_pass_again_at_once(handles):
    limiter, k = handles.open(), fresh("tpm")
    run = handles.run
    assert run(limiter.take([(k, 1000, 1000)], 0)) == 0
    run(limiter.give_back([(k, 1000, 700)], 10))  # the request used 300
    assert run(limiter.take([(k, 1000, 700)], 10)) == 0  # 700 back, and 0.17 drained
    assert run(limiter.take([(k, 1000, 1)], 10)) == 1


def test_a_give_back_never_fills_a_bucket_beyond_full(handles):
    limiter, k, other = handles.open(), fresh("tpm"), fresh("tpm")
    run = handles.run
    run(limiter.give_back([(k, 100, 50)], 0))  # to a full (new) bucket: nothing to return
    assert run(limiter.take([(k, 100, 100)], 0)) == 0
    assert run(limiter.take([(k, 100, 1)], 0)) == 1
    assert run(limiter.take([(other, 100, 10)], 0)) == 0
    run(limiter.give_back([(other, 100, 50)], 0))  # more than it took: full, no more
    assert run(limiter.take([(other, 100, 100)], 0)) == 0
    assert run(limiter.take([(other, 100, 1)], 0)) == 1


def test_a_negative_give_back_takes_whatever_the_bucket_holds(handles):
    limiter, k = handles.open(), fresh("tpm")
    run = handles.run
    assert run(limiter.take([(k, 100, 100)], 0)) == 0
    run(limiter.give_back([(k, 100, -50)], 0))  # the request used 50 more than it took
    assert run(limiter.take([(k, 100, 1)], 30_000)) == 1  # 50 back: it still owes 100
    assert run(limiter.take([(k, 100, 1)], 30_599)) == 1
    assert run(limiter.take([(k, 100, 1)], 30_600)) == 0


def test_concurrent_weighted_takes_on_two_handles_get_exactly_the_tokens(handles):
    limiters = [handles.open(), handles.open()]
    k = fresh("tpm")

    async def burst() -> list[int]:
        calls = [limiters[i % 2].take([(k, 1000, 100)], 1_000) for i in range(40)]
        return await asyncio.gather(*calls)

    waits = handles.run(burst())
    assert waits.count(0) == 10
    assert all(wait >= 1 for wait in waits if wait)


def test_on_its_own_clock_tokens_given_back_count_at_once(handles):
    """No time given: the server's clock for the shared limiters (the production path)."""
    limiter, k = handles.open(), fresh("tpm")
    run = handles.run
    assert run(limiter.take([(k, 1000, 1000)])) == 0
    assert run(limiter.take([(k, 1000, 500)])) in (29, 30)
    run(limiter.give_back([(k, 1000, 500)]))
    assert run(limiter.take([(k, 1000, 500)])) == 0


TPMS = st.integers(1, 5_000)


@PROPERTY
@given(project_tpm=TPMS, key_tpms=st.tuples(TPMS, TPMS), data=st.data())
def test_every_answer_is_the_reference(handles, project_tpm, key_tpms, data):
    limiter, reference = handles.first(), Reference()  # fresh buckets: examples stay apart
    project, keys = fresh("prj"), (fresh("key"), fresh("key"))
    now = 0
    for _ in range(data.draw(st.integers(1, 40))):
        which = data.draw(st.sampled_from([0, 1]))
        tokens = data.draw(st.integers(1, 5_000))  # clamped to each limit, as the stage does
        limits = [(project, project_tpm), (keys[which], key_tpms[which])]
        buckets = [(name, tpm, min(tokens, tpm)) for name, tpm in limits]
        now = data.draw(arrival(reference, buckets, now))
        expected = reference.take(buckets, now)
        assert handles.run(limiter.verdict(buckets, now)) == expected
        back = data.draw(st.integers(-2_000, 5_000))  # settled: given back, or more taken
        if back and expected[0] == 0:
            now += data.draw(GAPS)
            given = [(name, tpm, min(back, units)) for name, tpm, units in buckets]
            reference.give(given, now)
            handles.run(limiter.give_back(given, now))
