"""Helpers of the billing tests: what a project's books say, through the real CLI and API."""

from __future__ import annotations

from decimal import Decimal

import httpx

from tests.support.gateway_process import GatewayProcess


def micros(amount: str) -> int:
    return int(Decimal(amount) * 1_000_000)


def books(gw: GatewayProcess, project_id: str) -> dict[str, int]:
    shown = gw.cli("projects", "show", project_id)
    return {name: micros(shown[name]) for name in ("balance", "reserved", "month_spend")}


def receipt_cost(gw: GatewayProcess, key: str, receipt_id: str) -> int:
    response = httpx.get(
        f"{gw.url}/v1/receipts/{receipt_id}", headers={"authorization": f"Bearer {key}"}
    )
    assert response.status_code == 200, response.text
    return micros(response.json()["cost"])


def chat(model: str = "echo-1", content: str = "hello", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}
