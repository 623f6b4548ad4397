"""PostgreSQL's batched rate-limit moves (migration 0020): a batch decides each of its
items as `rate_limit_move` (0018) decides it alone, right after the items before it."""

from __future__ import annotations

import asyncio
import secrets

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_gateway.storage import open_storage
from tests.ratelimit.limiters import BASE_US, PROPERTY, InProcess

pytestmark = pytest.mark.postgres

BUCKETS = ["a", "b", "c", "d"]
RATES = {"a": 1, "b": 2, "c": 5, "d": 60}  # units per minute of each bucket


@st.composite
def moves(draw) -> tuple[list[str], list[int], bool, int]:
    """One request's move: distinct buckets, their units (a give-back's may be negative),
    forced or not, at a time that may go back as well as forward."""
    names = draw(st.lists(st.sampled_from(BUCKETS), min_size=1, max_size=3, unique=True))
    forced = draw(st.booleans())
    units = [
        draw(st.integers(-RATES[n] if forced else 1, RATES[n]).filter(lambda u: u != 0))
        for n in names
    ]
    return names, units, forced, draw(st.integers(0, 90_000))


@pytest.fixture(scope="module")
async def connection(postgres_url):
    await (await open_storage(postgres_url)).close()  # the migrations
    conn = await asyncpg.connect(postgres_url)
    yield conn
    await conn.close()


async def _rows(conn, prefix: str) -> dict[str, tuple[int, int, int]]:
    rows = await conn.fetch(
        "SELECT bucket, at_ms, level, empty_at_ms FROM rate_buckets WHERE bucket LIKE $1",
        prefix + "%",
    )
    return {r["bucket"][len(prefix) :]: (r["at_ms"], r["level"], r["empty_at_ms"]) for r in rows}


@PROPERTY
@given(batch=st.lists(moves(), min_size=1, max_size=12))
async def test_a_batch_decides_each_move_as_alone_after_the_ones_before(connection, batch):
    alone, together = f"{secrets.token_hex(4)}:", f"{secrets.token_hex(4)}:"
    expected = []
    for names, units, forced, at_ms in batch:
        row = await connection.fetchrow(
            "SELECT wait, refused FROM rate_limit_move($1, $2, $3, $4, $5::BIGINT)",
            [alone + n for n in names],
            [RATES[n] for n in names],
            units,
            forced,
            BASE_US + at_ms * 1000,
        )
        expected.append((row["wait"], row["refused"]))
    row = await connection.fetchrow(
        "SELECT waits, refused FROM rate_limit_move_many($1, $2, $3, $4, $5, $6)",
        [len(names) for names, _, _, _ in batch],
        [together + n for names, _, _, _ in batch for n in names],
        [RATES[n] for names, _, _, _ in batch for n in names],
        [u for _, units, _, _ in batch for u in units],
        [forced for _, _, forced, _ in batch],
        [BASE_US + at_ms * 1000 for _, _, _, at_ms in batch],
    )
    assert list(zip(row["waits"], row["refused"], strict=True)) == expected
    assert await _rows(connection, together) == await _rows(connection, alone)


async def test_concurrent_takes_share_statements_and_keep_their_order(postgres_url):
    """Takes asked for at once (one loop turn) go in batches, decided in the order they
    were asked: the first `rpm` pass, the rest wait, as one after the other."""
    storage = await open_storage(postgres_url)
    try:
        bucket = f"key_{secrets.token_hex(6)}"
        at = [BASE_US + n * 1000 for n in range(40)]
        verdicts = await asyncio.gather(
            *(storage.take_rate_limits([(bucket, 10, 1)], at_us) for at_us in at)  # type: ignore[attr-defined]
        )
        oracle = InProcess()
        expected = [await oracle.verdict([(bucket, 10)], n) for n in range(40)]
        assert [tuple(v) for v in verdicts] == expected
        assert [wait == 0 for wait, _ in verdicts] == [True] * 10 + [False] * 30
    finally:
        await storage.close()
