"""Hypothesis helpers shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def mostly(draw, usual, other, percent: int = 80):
    """`usual` in about `percent` % of draws: one_of alone weighs branches unevenly, and
    the requests that matter most are those that get past the early stages."""
    return draw(usual if draw(st.integers(0, 99)) < percent else other)
