"""A receipt's usage as SQLite stores it (migration 0011): input and output tokens in columns
of their own when they are 64-bit integers, every other count as JSON. The fast path for
a chat's usage of exactly those two counts must split as the rule says, whatever the dict."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from hypothesis import given
from hypothesis import strategies as st

from model_gateway.storage.sqlite import _split_usage

TOKENS = ("input_tokens", "output_tokens")
INT64_EDGES = [2**63 - 1, 2**63, -(2**63), -(2**63) - 1]
counts = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from(INT64_EDGES),
    st.booleans(),
    st.floats(allow_nan=False),
)
usages = st.one_of(
    st.dictionaries(st.sampled_from([*TOKENS, "duration_ms", "cached_tokens"]), counts),
    st.fixed_dictionaries(dict.fromkeys(TOKENS, counts)),  # the fast path's shape
)


def _by_the_rule(usage: dict[str, object]) -> tuple[object, object, str | None]:
    columns = [
        usage[name]
        if type(usage.get(name)) is int and -(2**63) <= usage[name] < 2**63  # type: ignore[operator]
        else None
        for name in TOKENS
    ]
    rest = {k: v for k, v in usage.items() if k not in TOKENS or columns[TOKENS.index(k)] is None}
    return columns[0], columns[1], orjson.dumps(rest).decode() if rest else None


def _outcome(split: Callable[[dict[str, object]], object], usage: dict[str, object]) -> object:
    try:
        return split(usage)
    except TypeError:  # a count JSON cannot hold (orjson: beyond 64 bits), either way
        return TypeError


@given(usages)
def test_usage_splits_by_the_rule(usage: dict[str, object]) -> None:
    assert _outcome(_split_usage, usage) == _outcome(_by_the_rule, usage)  # type: ignore[arg-type]


def test_a_chats_usage_takes_no_json() -> None:
    assert _split_usage({"input_tokens": 12, "output_tokens": 8}) == (12, 8, None)
    assert _split_usage({"input_tokens": 12, "output_tokens": True}) == (
        12,
        None,
        '{"output_tokens":true}',
    )
