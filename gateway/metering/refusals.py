"""402s that explain themselves: which limit refused the hold, and by how much.

A refused reservation says which limit applied (the key's monthly limit, the project's
monthly budget, or its available balance), the hold the request needed, and what was
left, so that a caller sees why 0.005 of balance refuses a call without `max_tokens`:
the hold covers the most the request can cost, the model's whole output included.
Only the key's own project ever calls with the key, so the figures are its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from model_gateway.gateway.metering.money import format_amount
from model_gateway.pipeline.errors import BudgetExceeded, GatewayError, InsufficientBalance
from model_gateway.storage import Storage

log = logging.getLogger("gateway.metering")

HOLD_HINT = (
    " The hold is the most the request can cost: for a model call, its prompt plus"
    " max_tokens of output (the model's maximum output when max_tokens is absent);"
    " a smaller max_tokens holds less."
)


def _usd(micros: int) -> str:
    return format_amount(micros) + " USD"


def _over(limit: int, spent: int, held: int, amount: int) -> bool:
    return spent + held + amount > limit


def _figure(f: Mapping[str, int | None], name: str) -> int:
    """A figure storage always reads (a NOT NULL column, or a sum with 0 for none)."""
    value = f[name]
    assert value is not None, name
    return value


def explain_figures(reason: str, amount: int, f: Mapping[str, int | None]) -> GatewayError:
    """The refusal for `reason` (budget_exceeded | insufficient_balance) given the figures
    (`Storage.limit_figures`)."""
    need = f"This request needs a hold of {_usd(amount)}"
    if reason == "insufficient_balance":
        balance, reserved = _figure(f, "balance"), _figure(f, "reserved")
        available = balance - reserved
        return InsufficientBalance(
            f"{need}, but the project's available balance is {_usd(max(available, 0))}"
            f" (balance {_usd(balance)}, of which {_usd(reserved)} is held by"
            " requests in flight)." + HOLD_HINT
        )
    limit = f.get("key_monthly_limit")
    if limit is not None:  # a key's figures: its limit, spend and holds
        key_spent, key_held = _figure(f, "key_month_spend"), _figure(f, "key_reserved")
        if _over(limit, key_spent, key_held, amount):
            left = limit - key_spent - key_held
            return BudgetExceeded(
                f"{need}, but the key's monthly limit of {_usd(limit)} has"
                f" {_usd(max(left, 0))} left ({_usd(key_spent)} spent this month,"
                f" {_usd(key_held)} held)." + HOLD_HINT
            )
    budget = f["monthly_budget"] if f["monthly_budget"] is not None else 0
    spent, held = _figure(f, "month_spend"), _figure(f, "reserved")
    left = budget - spent - held
    return BudgetExceeded(
        f"{need}, but the project's monthly budget of {_usd(budget)} has"
        f" {_usd(max(left, 0))} left ({_usd(spent)} spent this month,"
        f" {_usd(held)} held)." + HOLD_HINT
    )


async def explain(
    storage: Storage, reason: str, project_id: str, key_id: str | None, amount: int, month: str
) -> GatewayError:
    """The explained refusal; the plain one if the figures cannot be read."""
    try:
        figures = await storage.limit_figures(project_id, key_id, month)
    except Exception:
        log.exception("could not read the figures of a refused reservation")
        return BudgetExceeded() if reason == "budget_exceeded" else InsufficientBalance()
    return explain_figures(reason, amount, figures)
