"""SQLite stores the gateway's ids and digests as the bytes of their hex (migration 0011):
whatever text comes in reads back unchanged, and only lowercase hex is packed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_gateway.storage.sqlite import _pack, _unpack

PREFIXES = st.sampled_from(["", "rcpt_", "rsv_", "prj_", "key_", "req_"])
HEXISH = st.text(alphabet="0123456789abcdefABCDEF \n_x", max_size=40)


def defined_pack(prefix: str, value: object) -> object:
    """What `_pack` (in C) is held to: only a body that round-trips through bytes.fromhex
    and .hex() is packed (fromhex also takes uppercase and spaces)."""
    if not isinstance(value, str) or not value.startswith(prefix):
        return value
    body = value[len(prefix) :]
    try:
        packed = bytes.fromhex(body)
    except ValueError:
        return value
    return packed if packed and packed.hex() == body else value


@given(
    PREFIXES,
    st.one_of(
        st.none(), st.integers(), st.binary(max_size=8), HEXISH, st.text(max_size=20), PREFIXES
    ),
    st.booleans(),
)
def test_packing_is_its_python_definition(prefix, body, prefixed):
    value = prefix + body if prefixed and isinstance(body, str) else body
    assert _pack(prefix, value) == defined_pack(prefix, value)
    assert type(_pack(prefix, value)) is type(defined_pack(prefix, value))


def test_a_prefix_must_be_ascii_text():
    for prefix in ("é_", b"rsv_", None):
        with pytest.raises(TypeError):
            _pack(prefix, "rsv_ab")


@given(PREFIXES, st.one_of(st.none(), HEXISH, st.text(max_size=20)))
def test_any_value_reads_back_as_it_was_written(prefix, body):
    value = body if body is None else prefix + body
    assert _unpack(prefix, _pack(prefix, value)) == value


@given(PREFIXES, st.binary(min_size=1, max_size=32))
def test_lowercase_hex_is_packed_to_its_bytes(prefix, raw):
    assert _pack(prefix, prefix + raw.hex()) == raw


def test_anything_else_stays_text():
    for prefix, value in [
        ("rsv_", "rsv_ABCD"),  # uppercase would read back lowercase
        ("rsv_", "rsv_ab cd"),  # fromhex skips spaces
        ("rsv_", "rsv_abc"),  # odd length
        ("rsv_", "rsv_"),  # nothing to pack
        ("rsv_", "prj_abcd"),  # another prefix
    ]:
        assert _pack(prefix, value) == value
