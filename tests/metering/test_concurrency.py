"""60 parallel requests against money that covers only a few: never a micro-unit over."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.metering.billing import books, chat, micros, receipt_cost
from tests.support.gateway_process import GatewayProcess

# Each request holds ~0.0006 (body bytes + 50 output tokens) but costs ~0.0002.
REQUEST = chat(content="word " * 200, max_tokens=50)


async def fire(url: str, key: str, n: int = 60) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        return await asyncio.gather(
            *(
                client.post(
                    "/v1/chat/completions", json=REQUEST, headers={"authorization": f"Bearer {key}"}
                )
                for _ in range(n)
            )
        )


@pytest.fixture(scope="module")
def leased_gateway(tmp_path_factory):
    """A gateway whose requests reserve against leased slices (gateway/metering/leased_meter.py)."""
    config = "\n[metering]\nleases = true\n"
    with GatewayProcess(tmp_path_factory.mktemp("leases"), extra_config=config) as process:
        yield process


@pytest.fixture(scope="module")
def workers_gateway(tmp_path_factory):
    """Two workers (`gateway serve --workers 2`) on one database, each with its leases."""
    folder = tmp_path_factory.mktemp("workers")
    with GatewayProcess(folder, server_extra="workers = 2") as process:
        yield process


FIXTURES = {"holds": "gateway", "leases": "leased_gateway", "workers": "workers_gateway"}


@pytest.fixture(params=list(FIXTURES))
def metered(request):
    """The same rules with every request's own hold, with leased slices, and with two
    worker processes serving the requests."""
    return request.getfixturevalue(FIXTURES[request.param])


@pytest.mark.parametrize(
    ("project_options", "key_options", "refusal"),
    [
        (["--balance", "0.001"], [], "insufficient_balance"),
        (["--balance", "10", "--budget", "0.001"], [], "budget_exceeded"),
        (["--balance", "10"], ["--monthly-limit", "0.001"], "budget_exceeded"),
        # Enough for slices of several holds: leased, then short of money.
        (["--balance", "0.01"], [], "insufficient_balance"),
    ],
    ids=["balance", "project-budget", "key-monthly-limit", "balance-for-slices"],
)
async def test_parallel_requests_never_overspend(metered, project_options, key_options, refusal):
    gateway = metered
    project = gateway.create_project("race", *project_options)
    key = gateway.create_key(project, "inference,receipts", *key_options)
    before = books(gateway, project)

    responses = await fire(gateway.url, key)

    served = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert served and refused, "the money must cover some requests and not all"
    assert {r.status_code for r in refused} == {402}
    assert {r.json()["error"]["type"] for r in refused} == {refusal}
    assert all("x-receipt-id" not in r.headers for r in refused)
    costs = [receipt_cost(gateway, key, r.headers["x-receipt-id"]) for r in served]
    after = books(gateway, project)
    assert after["reserved"] == 0
    assert after["balance"] == before["balance"] - sum(costs)
    assert after["month_spend"] == sum(costs)
    assert after["balance"] >= 0
    assert sum(costs) <= micros("0.001") or refusal == "insufficient_balance"
    if key_options:
        shown = gateway.cli("keys", "show", key[:18])
        assert micros(shown["month_spend"]) == sum(costs) <= micros("0.001")
