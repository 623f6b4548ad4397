"""What a test reads of the workers: each one's own samples (its socket in the run folder,
before any merging), the merged `/metrics`, parallel requests on fresh connections."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

CHAT = "/v1/chat/completions"


def worker_samples(run_folder: Path) -> dict[str, dict]:
    """Per worker socket (by file name): its samples, as it sends them to the others."""
    found = {}
    for path in sorted(run_folder.glob("worker-*.metrics.sock")):
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(path))
            data = b"".join(iter(lambda: conn.recv(65536), b""))
        found[path.name] = orjson.loads(data)
    return found


def requests_counted(samples: dict, endpoint: str = CHAT, status: str = "200") -> float:
    """A worker's gateway_requests_total for the endpoint and status."""
    return sum(
        value
        for labels, value in samples["gateway_requests"]
        if labels[0] == endpoint and labels[2] == status
    )


def scraped(url: str, endpoint: str = CHAT, status: str = "200") -> float:
    """The server's gateway_requests_total for the endpoint and status, from /metrics."""
    text = httpx.get(url + "/metrics", headers={"connection": "close"}).text
    for family in text_string_to_metric_families(text):
        if family.name == "gateway_requests":
            return sum(
                s.value
                for s in family.samples
                if s.name == "gateway_requests_total"
                and s.labels["endpoint"] == endpoint
                and s.labels["status"] == status
            )
    return 0.0


def chat_body(model: str = "echo-1", **extra: object) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def fire(url: str, key: str, n: int, body: dict | None = None) -> list[httpx.Response]:
    """`n` requests at once, each on a connection of its own (spread by the kernel)."""

    async def one(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post(
            CHAT,
            json=body or chat_body(),
            headers={"authorization": f"Bearer {key}", "connection": "close"},
        )

    async def all_of_them() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
            return await asyncio.gather(*(one(client) for _ in range(n)))

    return asyncio.run(all_of_them())
