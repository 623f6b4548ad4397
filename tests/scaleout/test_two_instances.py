"""Two gateway instances on one fresh PostgreSQL database, one secrets folder: 60
concurrent requests alternating between them against money that covers a few. Exactly
as many are served as the money covers, never one more, and nothing stays reserved.

The hold equals the cost here, so the count is exact whatever the timing: the model's
input price is zero (the body's size bounds the prompt, not the upstream's count) and
the fake upstream reports as its output every token the gateway holds for `max_tokens`.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from decimal import Decimal

import httpx
import pytest

from model_gateway.gateway.metering.pricing import held_output_tokens
from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.storage import open_storage
from tests.storage.backends import postgres_database
from tests.support.fake_openai import AT_THE_HOLD, FakeOpenAI
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import OPENAI_CREDENTIAL, UPSTREAM_ENV

pytestmark = pytest.mark.postgres

MODEL = "exact-1"
PER_TOKEN = 200  # micro-units per output token: "200.00" per million tokens
OUTPUT_LIMIT = 5
HOLD = held_output_tokens(OUTPUT_LIMIT, OUTPUT_LIMIT) * PER_TOKEN  # = the cost of one request
COVERED = 12  # requests the money covers
MONEY = f"{Decimal(COVERED * HOLD) / 1_000_000}"
REQUESTS = 60


def model_config(upstream_url: str) -> str:
    return f"""
[providers.fakeai]
kind = "openai"
base_url = "{upstream_url}/v1"
api_key_env = "FAKE_OPENAI_KEY"

[models."{MODEL}"]
provider = "fakeai"
upstream = "{AT_THE_HOLD}"
input_price_per_mtok = "0"
output_price_per_mtok = "{PER_TOKEN}"
"""


@pytest.fixture(scope="module")
def instances(postgres_url, tmp_path_factory):
    """Two instances of one deployment: one database, one key pepper and log key."""
    root = tmp_path_factory.mktemp("two-instances")
    secrets = root / "secrets"
    secrets.mkdir()
    with ExitStack() as stack:
        url = stack.enter_context(postgres_database())
        upstream = stack.enter_context(FakeOpenAI(OPENAI_CREDENTIAL))
        gateways = []
        for name in ("a", "b"):
            (root / name).mkdir()
            gateway = GatewayProcess(
                root / name,
                storage_url=url,
                secrets_dir=str(secrets),
                extra_config=model_config(upstream.url),
                env=UPSTREAM_ENV,
            )
            gateways.append(stack.enter_context(gateway))
        yield url, gateways


def micros(amount: str) -> int:
    return int(Decimal(amount) * 1_000_000)


def audit(url: str, project_id: str) -> None:
    """The counters equal the rows they summarise, read by a storage handle of its own."""

    async def read():
        storage = await open_storage(url)
        try:
            return await storage.audit(project_id, current_month())
        finally:
            await storage.close()

    with ThreadPoolExecutor(1) as thread:  # the test's own loop may be running
        found = thread.submit(asyncio.run, read()).result()
    assert found.balance == found.ledger_sum
    assert found.reserved == found.open_reservations_sum == 0


async def send(client: httpx.AsyncClient, url: str, key: str, stream: bool) -> httpx.Response:
    body = {
        "model": MODEL,
        "max_tokens": OUTPUT_LIMIT,
        "stream": stream,
        "messages": [{"role": "user", "content": "How much is left?"}],
    }
    request = client.build_request(
        "POST", url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    response = await client.send(request, stream=True)
    await response.aread()  # a stream is read to its end: it settles at the last byte
    return response


async def fire(urls: list[str], key: str, stream: bool) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=REQUESTS)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        return await asyncio.gather(
            *(send(client, urls[i % 2], key, stream) for i in range(REQUESTS))
        )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize(
    ("project_options", "key_options", "refusal"),
    [
        (["--balance", MONEY], [], "insufficient_balance"),
        (["--balance", "10", "--budget", MONEY], [], "budget_exceeded"),
        (["--balance", "10"], ["--monthly-limit", MONEY], "budget_exceeded"),
    ],
    ids=["balance", "project-budget", "key-monthly-limit"],
)
def test_two_instances_serve_exactly_what_the_money_covers(
    instances, project_options, key_options, refusal, stream
):
    url, (a, b) = instances
    project = a.create_project("race", *project_options)
    key = b.create_key(project, "inference,receipts", *key_options)
    credits = micros(a.cli("projects", "show", project)["balance"])

    responses = asyncio.run(fire([a.url, b.url], key, stream))

    served = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert len(served) == COVERED, [r.status_code for r in responses]
    assert {r.status_code for r in refused} == {402}
    assert {r.json()["error"]["type"] for r in refused} == {refusal}
    assert all("x-receipt-id" not in r.headers for r in refused)
    if stream:
        assert all(r.text.rstrip().endswith("data: [DONE]") for r in served)
    # Each receipt read from the instance that did not serve it: one set of books.
    costs = []
    for response in served:
        other = b if str(response.url).startswith(a.url) else a
        receipt = httpx.get(
            f"{other.url}/v1/receipts/{response.headers['x-receipt-id']}",
            headers={"authorization": f"Bearer {key}"},
        )
        assert receipt.status_code == 200, receipt.text
        costs.append(micros(receipt.json()["cost"]))
    assert costs == [HOLD] * COVERED
    shown = b.cli("projects", "show", project)
    assert micros(shown["reserved"]) == 0
    assert micros(shown["balance"]) == credits - sum(costs)
    assert micros(shown["month_spend"]) == sum(costs)
    if key_options:
        assert micros(a.cli("keys", "show", key[:18])["month_spend"]) == sum(costs)
    audit(url, project)
