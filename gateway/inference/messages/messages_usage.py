"""Usage on /v1/messages, in Anthropic's convention: `input_tokens` is the input neither
read from nor written to the prompt cache, which `cache_read_input_tokens` and
`cache_creation_input_tokens` count. Receipts keep the gateway's convention: all three
are input (gateway.inference.usage), so what is billed is read from an Anthropic
upstream's usage as their sum, and what is shown is the billed usage split back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from model_gateway.gateway.inference.usage import (
    CHAT_KEYS,
    Prompt,
    Text,
    billed_usage,
    reported,
    token_count,
)
from model_gateway.gateway.providers.anthropic.anthropic_messages import chat_usage

if TYPE_CHECKING:
    from model_gateway.gateway.inference.json_types import JSONObject


def anthropic_usage(billed: dict[str, int], cache_read: Any, cache_write: Any) -> JSONObject:
    """The billed usage (all input) in Anthropic's convention, with the cache counts the
    upstream reported: one that is no count, or together more than the input billed, is
    shown 0 (the whole input then counts as `input_tokens`)."""
    read, write = token_count(cache_read) or 0, token_count(cache_write) or 0
    if read + write > billed["input_tokens"]:
        read = write = 0
    return {
        "input_tokens": billed["input_tokens"] - read - write,
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
        "output_tokens": billed["output_tokens"],
    }


def chat_cache_counts(usage: Any) -> tuple[Any, Any]:
    """A chat usage's cache reads and cache writes (`prompt_tokens_details`), as reported."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if not isinstance(details, dict):
        return None, None
    return details.get("cached_tokens"), details.get("cache_write_tokens")


def native_counts(usage: Any) -> dict[str, Any]:
    """An Anthropic usage's counts under the gateway's names (input: all three kinds), as
    reported (a count that is none stays None: `usage.billed_usage` counts instead)."""
    return reported(chat_usage(usage), CHAT_KEYS)


def shown_native_usage(usage: Any, prompt: Prompt, output: Text) -> Any:
    """An Anthropic upstream's usage as the client gets it: as it came, unless one of
    its counts is none; then the billed counts in their place, so that the answer says
    what the receipt says."""
    billed, source = billed_usage(native_counts(usage), prompt, output)
    if source == "provider":
        return usage
    shown = dict(usage) if isinstance(usage, dict) else {}
    cache = shown.get("cache_read_input_tokens"), shown.get("cache_creation_input_tokens")
    return {**shown, **anthropic_usage(billed, *cache)}
