"""The usage a request is billed: each count the upstream reported when it is a count,
else the gateway's own (decisions.md, "Hardening decisions").

An upstream's usage is not trusted to be well formed: a negative, fractional, textual,
null or absurd count would make a negative cost (a settle that fails), a 500, or a
receipt the log refuses. Any such value, or a missing one, is replaced by the gateway's
count (`tokens.estimate_tokens`: the prompt's bytes / 4 for input, the delivered text's
for output), and the billing says so: `Billing.usage_source` "gateway" (else "provider").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from model_gateway.gateway.inference.tokens import estimate_tokens
from model_gateway.pipeline.context import Billing, Outcome, UsageSource

# No model reads or writes a billion tokens in one request: a larger count is a broken
# upstream, and sums of such counts would overflow storage's 64-bit integers.
MAX_TOKENS = 10**9

# The gateway's usage record: all input and all output (reasoning included), then the
# classes within them (decisions.md, "Prices, exactly"), kept only when not 0.
KEYS = ("input_tokens", "output_tokens")
INPUT_CLASSES = ("cached_input_tokens", "cache_write_tokens", "cache_write_1h_tokens")
OUTPUT_CLASSES = ("reasoning_tokens",)
# Where an API's usage object keeps each class, within its details objects.
_DETAIL_NAMES = {
    "cached_input_tokens": "cached_tokens",
    "cache_write_tokens": "cache_write_tokens",  # the gateway's neutral chat usage
    "cache_write_1h_tokens": "cache_write_1h_tokens",
    "reasoning_tokens": "reasoning_tokens",
}


class UsageKeys(NamedTuple):
    """Where an API's usage object keeps the input and output counts, and their details."""

    input: str
    output: str
    input_details: str
    output_details: str


CHAT_KEYS = UsageKeys(
    "prompt_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details"
)
RESPONSES_KEYS = UsageKeys(
    "input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details"
)

# A text; or what makes it, decoded only if a count is missing; or (a stream's delivered
# output, of which only the count is kept) its size in UTF-8 bytes.
Text = str | int | Callable[[], str]


def _estimate(text: Text) -> int:
    if isinstance(text, int):
        return -(-text // 4)  # as tokens.estimate_tokens counts a text of that size
    return estimate_tokens(text if isinstance(text, str) else text())


class Prompt(NamedTuple):
    """What a request asks the model to read: its text (the gateway's own count reads it)
    and the most input tokens it can be billed: its body's bytes, as the hold prices it
    (no tokenizer makes more tokens than bytes), so a larger count is no count."""

    text: str
    max_tokens: int


def token_count(value: Any) -> int | None:
    """`value` if it is a plausible token count, else None (true is no count, though an int)."""
    if type(value) is int and 0 <= value <= MAX_TOKENS:
        return value
    return None


def reported(usage: Any, keys: UsageKeys) -> dict[str, Any]:
    """An upstream usage object's counts under the gateway's names, as reported: input,
    output and the classes within them (those it reports)."""
    if not isinstance(usage, dict):
        return {}
    counts = {"input_tokens": usage.get(keys.input), "output_tokens": usage.get(keys.output)}
    for details_key, classes in (
        (keys.input_details, INPUT_CLASSES),
        (keys.output_details, OUTPUT_CLASSES),
    ):
        details = usage.get(details_key)
        if isinstance(details, dict):
            for name in classes:
                if _DETAIL_NAMES[name] in details:
                    counts[name] = details[_DETAIL_NAMES[name]]
    return counts


def _classes(counts: dict[str, Any], usage: dict[str, int]) -> None:
    """Add to `usage` the classes `counts` reports within its billed input and output:
    a class that is no count, or that does not fit in its total, is left out (billed at
    the total's own price), as are all of them when the total is the gateway's count."""
    cached = token_count(counts.get("cached_input_tokens")) or 0
    writes = token_count(counts.get("cache_write_tokens")) or 0
    one_hour = token_count(counts.get("cache_write_1h_tokens")) or 0
    if cached + writes > usage["input_tokens"]:
        cached = writes = 0
    if one_hour > writes:
        one_hour = 0
    reasoning = token_count(counts.get("reasoning_tokens")) or 0
    if reasoning > usage["output_tokens"]:
        reasoning = 0
    found = zip(
        (*INPUT_CLASSES, *OUTPUT_CLASSES), (cached, writes, one_hour, reasoning), strict=True
    )
    usage.update((name, count) for name, count in found if count)


def billed_usage(
    counts: dict[str, Any], prompt: Prompt, output: Text
) -> tuple[dict[str, int], UsageSource]:
    """The usage to bill: each reported count that is one, the gateway's count for the rest;
    the classes within a total the upstream counted."""
    usage: dict[str, int] = {}
    source: UsageSource = "provider"
    for key, text in zip(KEYS, (prompt.text, output), strict=True):
        count = token_count(counts.get(key))
        if count is not None and key == "input_tokens" and count > prompt.max_tokens:
            count = None  # more tokens than the request has bytes: no count
        if count is None:
            count, source = _estimate(text), "gateway"
        usage[key] = count
    if source == "provider" and len(counts) > 2:
        _classes(counts, usage)
    return usage, source


def billing(
    outcome: Outcome, counts: dict[str, Any], prompt: Prompt, output: Text, digest: str | None
) -> Billing:
    usage, source = billed_usage(counts, prompt, output)
    return Billing(outcome, usage, digest, usage_source=source)


def cancelled(prompt: Prompt) -> Billing:
    """A client that left after the upstream accepted, before any output reached it: the
    prompt the upstream read. (Once output went out, the stream bills it: streaming._meter.)"""
    return billing("cancelled", {}, prompt, 0, None)


def shown_usage(usage: Any, prompt: Prompt, output: Text, keys: UsageKeys) -> Any:
    """The usage object the client gets: the upstream's, with the gateway's count in place
    of any that is not a count, so that the answer says what the receipt says. (No usage
    stays no usage.)"""
    if usage is None:
        return None
    billed, source = billed_usage(reported(usage, keys), prompt, output)
    if source == "provider":
        return usage
    shown = dict(usage) if isinstance(usage, dict) else {}
    shown[keys.input], shown[keys.output] = billed["input_tokens"], billed["output_tokens"]
    shown["total_tokens"] = billed["input_tokens"] + billed["output_tokens"]
    return shown
