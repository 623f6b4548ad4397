"""Two gateway instances on one fresh PostgreSQL database, with a short lease."""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx

from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.storage import open_storage
from tests.support.gateway_process import GatewayProcess

LEASE_S = 2.0


def cluster(lease_s: float = LEASE_S) -> str:
    return f"\n[cluster]\nlease_s = {lease_s}\n"


CLUSTER = cluster()


def instance(
    folder, url: str, secrets: str, extra: str = "", lease_s: float = LEASE_S, **options
) -> GatewayProcess:
    folder.mkdir()
    return GatewayProcess(
        folder,
        storage_url=url,
        secrets_dir=secrets,
        extra_config=cluster(lease_s) + extra,
        **options,
    )


def owner_of(gw: GatewayProcess) -> str:
    """The instance id of a running gateway: host:pid:start-time."""
    assert gw.process is not None
    with open(f"/proc/{gw.process.pid}/stat") as stat:
        ticks = stat.read().rsplit(")", 1)[1].split()[19]
    return f"{socket.gethostname()}:{gw.process.pid}:{ticks}"


def chat(gw: GatewayProcess, key: str, **extra) -> httpx.Response:
    body = {"model": "echo-1", "messages": [{"role": "user", "content": "hi"}], **extra}
    return httpx.post(
        gw.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
    )


def run(coroutine):
    """Run a coroutine from a sync test, on a thread of its own."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()


def books(url: str, project_id: str) -> dict[str, int]:
    async def read() -> dict[str, int]:
        storage = await open_storage(url)
        try:
            account = await storage.project_account(project_id, current_month())
            audit = await storage.audit(project_id, current_month())
        finally:
            await storage.close()
        assert audit.balance == audit.ledger_sum
        assert audit.reserved == audit.open_reservations_sum
        return {"balance": account.balance, "reserved": account.reserved}

    return run(read())
