"""Exact money: integers of micro-units on every path, decimal strings on the wire."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

MICROS_PER_UNIT = 1_000_000


# No credit, budget, limit or price is larger, and sums of several stay within storage's
# 64-bit integers (9.2 * 10**18 micro-units).
MAX_UNITS = 10**12


def parse_amount(value: str | int | float | Decimal, *, at_most: int | None = MAX_UNITS) -> int:
    """A wire amount ("12.5", 12.5, 12) to micro-units; more than 6 decimals is an error,
    and so is more than `at_most` units (None: an amount the gateway wrote, read back)."""
    if isinstance(value, bool):
        raise ValueError("an amount must be a number or a decimal string")
    try:
        # str() first: a JSON float like 0.1 becomes "0.1", not its binary expansion.
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise ValueError(f"not a decimal amount: {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"an amount must be a finite, non-negative number: {value!r}")
    if at_most is not None and amount > at_most:
        raise ValueError(f"an amount is at most {at_most:,}: {value!r}")
    micros = amount * MICROS_PER_UNIT
    if micros != micros.to_integral_value():
        raise ValueError(f"an amount has at most 6 decimals: {value!r}")
    return int(micros)


def format_amount(micros: int) -> str:
    """Micro-units to a decimal string with 6 decimals, e.g. 120 -> "0.000120"."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS_PER_UNIT)
    return f"{sign}{whole}.{frac:06d}"


def cost_of_tokens(tokens: int, price_per_mtok: int) -> int:
    """Micro-units for `tokens` at a price in micro-units per million tokens, rounded up."""
    return -(-tokens * price_per_mtok // 1_000_000)
