"""The raw-JSON check for integers wider than 64 bits agrees with orjson, which writes the
body back: a body passes exactly when orjson can write what msgspec read from it."""

from __future__ import annotations

import json

import msgspec
import orjson
from hypothesis import given
from hypothesis import strategies as st

from model_gateway.pipeline.raw_json import too_wide_error, too_wide_offset

wide_ints = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([-(2**63), -(2**63) - 1, 2**63, 2**64 - 1, 2**64, -(10**19), 10**19]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    wide_ints,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet='0123456789-.e"\\ab', max_size=40),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


def writable(value: object) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


@given(documents)
def test_a_body_passes_exactly_when_orjson_can_write_it_back(document):
    body = json.dumps(document).encode()
    assert (too_wide_offset(body) is None) == writable(msgspec.json.decode(body))


def test_the_error_names_the_member_that_holds_the_integer():
    body = b'{"a": {"b": [1, 2, 18446744073709551616]}, "c": "99999999999999999999"}'
    assert too_wide_error(body, too_wide_offset(body)).param == "a.b.2"
