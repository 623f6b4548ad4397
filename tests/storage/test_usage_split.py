"""A receipt's usage as SQLite stores it (migration 0011): input and output tokens in columns
of their own when they are 64-bit integers, every other count as JSON. The fast path for
a chat's usage of exactly those two counts must split as the rule says, whatever the dict."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from model_gateway.storage.sqlite import _split_usage

TOKENS = ("input_tokens", "output_tokens")
counts = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64), st.booleans(), st.floats(allow_nan=False)
)
usages = st.dictionaries(st.sampled_from([*TOKENS, "duration_ms", "cached_tokens"]), counts)


def _by_the_rule(usage: dict[str, object]) -> tuple[object, object, str | None]:
    columns = [
        usage[name]
        if type(usage.get(name)) is int and -(2**63) <= usage[name] < 2**63  # type: ignore[operator]
        else None
        for name in TOKENS
    ]
    rest = {k: v for k, v in usage.items() if k not in TOKENS or columns[TOKENS.index(k)] is None}
    return columns[0], columns[1], orjson.dumps(rest).decode() if rest else None


@given(usages)
def test_usage_splits_by_the_rule(usage: dict[str, object]) -> None:
    assert _split_usage(usage) == _by_the_rule(usage)  # type: ignore[arg-type]


def test_a_chats_usage_takes_no_json() -> None:
    assert _split_usage({"input_tokens": 12, "output_tokens": 8}) == (12, 8, None)
    assert _split_usage({"input_tokens": 12, "output_tokens": True}) == (
        12,
        None,
        '{"output_tokens":true}',
    )
