"""The one SSE parser: whatever the chunking and line endings, the same events."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from model_gateway.gateway.inference.sse import Event, SSEDecoder, data_event, named_event

TEXT = st.text(
    st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20
)
EVENTS = st.lists(st.tuples(st.one_of(st.none(), TEXT.filter(bool)), TEXT), max_size=8)


def encode(events: list[tuple[str | None, str]], newline: bytes) -> bytes:
    raw = b""
    for name, data in events:
        if name is not None:
            raw += b"event: " + name.encode() + newline
        raw += b": a comment" + newline + b"data: " + data.encode() + newline + newline
    return raw


@given(EVENTS, st.sampled_from([b"\n", b"\r\n", b"\r"]), st.lists(st.integers(0, 400)))
def test_chunking_never_changes_the_events(events, newline, cuts):
    raw = encode(events, newline)
    decoder = SSEDecoder()
    got: list[Event] = []
    start = 0
    for cut in sorted(cuts):
        got += decoder.feed(raw[start:cut])
        start = max(start, cut)
    got += decoder.feed(raw[start:])
    assert got == [Event(name, data) for name, data in events]


def test_multi_line_data_and_unterminated_tail():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\ndata: b\n\ndata: never finished") == [Event(None, "a\nb")]
    assert decoder.feed(b"") == []


def test_writer_round_trips():
    raw = data_event({"x": "é"}) + named_event("response.created", {"y": 1})
    assert SSEDecoder().feed(raw) == [
        Event(None, '{"x":"é"}'),
        Event("response.created", '{"y":1}'),
    ]
