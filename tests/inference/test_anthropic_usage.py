"""Anthropic's usage as chat usage: the cache counts the API leaves null are no counts
(nothing to add), any other value that is not a count leaves the sum to the gateway, and
a stream's later events repeat only what they change."""

from __future__ import annotations

import pytest

from model_gateway.gateway.providers.anthropic.anthropic_messages import ChunkTranslator, chat_usage


def test_null_cache_counts_are_nothing_to_add():
    usage = chat_usage(
        {
            "input_tokens": 5,
            "output_tokens": 3,
            "cache_creation_input_tokens": None,
            "cache_read_input_tokens": None,
        }
    )
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (5, 3, 8)


def test_cache_counts_are_part_of_the_prompt():
    usage = chat_usage(
        {
            "input_tokens": 5,
            "output_tokens": 3,
            "cache_creation_input_tokens": 2,
            "cache_read_input_tokens": 4,
        }
    )
    assert usage["prompt_tokens"] == 11
    assert usage["prompt_tokens_details"] == {"cached_tokens": 4, "cache_write_tokens": 2}


@pytest.mark.parametrize("bad", [-1, "5", 5.5, True, 2**63])
@pytest.mark.parametrize("field", ["input_tokens", "cache_read_input_tokens"])
def test_a_broken_prompt_count_leaves_the_prompt_to_the_gateway(field, bad):
    usage = chat_usage({"input_tokens": 5, "output_tokens": 3} | {field: bad})
    assert usage["prompt_tokens"] is None and usage["total_tokens"] is None
    assert usage["completion_tokens"] == 3


def test_a_stream_keeps_its_start_counts_when_later_events_send_null():
    translator = ChunkTranslator("m")
    start = {"usage": {"input_tokens": 7, "output_tokens": 1}}
    translator.feed({"type": "message_start", "message": start})
    translator.feed(
        {"type": "message_delta", "delta": {}, "usage": {"input_tokens": None, "output_tokens": 9}}
    )
    *_, usage_chunk = translator.feed({"type": "message_stop"})
    assert usage_chunk["usage"]["prompt_tokens"] == 7
    assert usage_chunk["usage"]["completion_tokens"] == 9
