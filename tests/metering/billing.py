"""Helpers of the billing tests: what a project's books say, through the real CLI and API."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx

from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.storage import open_storage
from tests.support.gateway_process import GatewayProcess


def micros(amount: str) -> int:
    return int(Decimal(amount) * 1_000_000)


def books(gw: GatewayProcess, project_id: str) -> dict[str, int]:
    """The project's account, read from its database file by a second storage handle
    (as `gateway projects show` does, without a process start per call)."""

    async def read() -> dict[str, int]:
        storage = await open_storage(f"sqlite:///{gw.folder / 'data' / 'gateway.db'}")
        try:
            account = await storage.project_account(project_id, current_month())
            audit = await storage.audit(project_id, current_month())
        finally:
            await storage.close()
        # The counters must always equal the rows they summarise.
        assert audit.balance == audit.ledger_sum
        assert audit.reserved == audit.open_reservations_sum
        return {
            "balance": account.balance,
            "reserved": account.reserved,
            "month_spend": account.month_spend,
        }

    # A thread of its own: the caller may be a test already running an event loop.
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, read()).result()


def receipt_cost(gw: GatewayProcess, key: str, receipt_id: str) -> int:
    response = httpx.get(
        f"{gw.url}/v1/receipts/{receipt_id}", headers={"authorization": f"Bearer {key}"}
    )
    assert response.status_code == 200, response.text
    return micros(response.json()["cost"])


def chat(model: str = "echo-1", content: str = "hello", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}
