"""Two gateway processes with leases on one PostgreSQL database: a balance for N requests
serves them whichever process gets them (a lease never refuses what the balance covers:
the process short of money gets back what the other leased), and the leases go back when
the processes are idle."""

from __future__ import annotations

import asyncio
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.storage import open_storage
from tests.metering.billing import chat, micros, receipt_cost
from tests.support.gateway_process import GatewayProcess

pytestmark = pytest.mark.postgres

LEASES = "\n[metering]\nleases = true\n"
REQUEST = chat(content="word " * 50, max_tokens=40)


def read(url: str, reader):
    """`reader(storage)` over a handle of its own, on a loop of its own."""

    async def run():
        storage = await open_storage(url)
        try:
            return await reader(storage)
        finally:
            await storage.close()

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, run()).result()


def post(gw: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        json=REQUEST,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_a_balance_for_n_requests_serves_n_on_either_process(tmp_path, fresh_postgres_url):
    shared = str(tmp_path / "secrets")
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    processes = [
        GatewayProcess(
            tmp_path / name, storage_url=fresh_postgres_url, secrets_dir=shared,
            extra_config=LEASES,
        )
        for name in ("a", "b")
    ]  # fmt: skip
    with processes[0], processes[1]:
        a = processes[0]
        # The hold this request needs, as a refusal states it.
        empty = a.create_project("empty")
        refused = post(a, a.create_key(empty, "inference"))
        assert refused.status_code == 402
        hold = micros(re.search(r"needs a hold of ([0-9.]+) USD", refused.text).group(1))

        n = 12
        project = a.create_project("n", "--balance", str(n * hold / 1_000_000))
        key = a.create_key(project, "inference,receipts")
        balance, served, picks = n * hold, [], random.Random(14)
        while True:
            gw = processes[picks.randrange(2)]
            response = post(gw, key)
            if balance < hold:  # today's rule: what is left cannot hold it
                assert response.status_code == 402, response.text
                break
            assert response.status_code == 200, (len(served), balance, response.text)
            receipt_id = response.headers["x-receipt-id"]
            balance -= receipt_cost(gw, key, receipt_id)
            served.append(receipt_id)
        assert len(served) >= n

        async def books(storage):
            account = await storage.project_account(project, current_month())
            receipts = [await storage.get_receipt(r) for r in served]
            return account, [r.reservation_id for r in receipts if r is not None]

        account, charged_against = read(fresh_postgres_url, books)
        # Requests were served from leases: a direct hold is charged once, a lease many times.
        assert len(set(charged_against)) < len(charged_against) == len(served)
        assert account.balance == balance and account.reserved == 0
        # Unused, the leases go back (IDLE_S).
        deadline = time.monotonic() + 10
        while account.leased and time.monotonic() < deadline:
            time.sleep(0.2)
            account, _ = read(fresh_postgres_url, books)
        assert account.leased == 0
