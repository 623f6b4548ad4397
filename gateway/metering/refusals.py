"""402s that explain themselves: which limit refused the hold, and by how much.

A refused reservation says which limit applied (the key's monthly limit, the project's
monthly budget, or its available balance), the hold the request needed, and what was
left, so that a caller sees why 0.005 of balance refuses a call without `max_tokens`:
the hold covers the most the request can cost, the model's whole output included.
Only the key's own project ever calls with the key, so the figures are its own.
"""

from __future__ import annotations

import logging

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


def explain_figures(reason: str, amount: int, f: dict) -> GatewayError:
    """The refusal for `reason` (budget_exceeded | insufficient_balance) given the figures."""
    need = f"This request needs a hold of {_usd(amount)}"
    if reason == "insufficient_balance":
        available = f["balance"] - f["reserved"]
        return InsufficientBalance(
            f"{need}, but the project's available balance is {_usd(max(available, 0))}"
            f" (balance {_usd(f['balance'])}, of which {_usd(f['reserved'])} is held by"
            " requests in flight)." + HOLD_HINT
        )
    limit = f.get("key_monthly_limit")
    if limit is not None and _over(limit, f["key_month_spend"], f["key_reserved"], amount):
        left = limit - f["key_month_spend"] - f["key_reserved"]
        return BudgetExceeded(
            f"{need}, but the key's monthly limit of {_usd(limit)} has {_usd(max(left, 0))}"
            f" left ({_usd(f['key_month_spend'])} spent this month, {_usd(f['key_reserved'])}"
            " held)." + HOLD_HINT
        )
    budget = f["monthly_budget"] if f["monthly_budget"] is not None else 0
    left = budget - f["month_spend"] - f["reserved"]
    return BudgetExceeded(
        f"{need}, but the project's monthly budget of {_usd(budget)} has"
        f" {_usd(max(left, 0))} left ({_usd(f['month_spend'])} spent this month,"
        f" {_usd(f['reserved'])} held)." + HOLD_HINT
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
