"""Money beyond 64 bits, through a real gateway on each storage backend: a payment,
purchase or credit that would take a balance past 2^63-1 micro-units is 409 `conflict`
(the CLI exits non-zero with `conflict`), nothing is credited, and the balance stays an
exact integer that later small amounts still move."""

from __future__ import annotations

import pytest

from tests.console.rpc_double import Chain, RpcDouble, address
from tests.console.support import ConsoleClient, create_user, error_type
from tests.console.test_purchases import TOKEN, TREASURY, purchases_config
from tests.storage.backends import STORAGE_BACKENDS, postgres_database
from tests.support.gateway_process import CliFailed, GatewayProcess

TRILLION = "1000000000000"  # the most one payment may be, in units
NINE_TRILLION = "9000000000000.000000"  # nine of them: 9e18 micro-units, under 2^63-1


@pytest.fixture(scope="module")
def chain():
    chain = Chain()
    with RpcDouble(chain) as double:
        chain.url = double.url
        yield chain


@pytest.fixture(scope="module", params=STORAGE_BACKENDS)
def gateway(request, tmp_path_factory, chain):
    def start(storage_url: str) -> GatewayProcess:
        folder = tmp_path_factory.mktemp(request.param)
        extra = purchases_config(chain.url, 6)
        return GatewayProcess(folder, extra_config=extra, storage_url=storage_url).start()

    if request.param == "sqlite":
        process = start("sqlite:///data/gateway.db")
        yield process
        process.stop()
        return
    request.getfixturevalue("postgres_url")  # the server check: skip, or fail in CI
    with postgres_database() as url:
        process = start(url)
        yield process
        process.stop()


@pytest.fixture(scope="module")
def client(gateway):
    create_user(gateway, "owner@example.com")
    client = ConsoleClient(gateway)
    client.login("owner@example.com")
    yield client
    client.close()


def _pay(client, project: str, amount: str, reference: str):
    body = {"amount": amount, "reference": reference}
    return client.post(f"/console/api/projects/{project}/payments", body)


def _balance(client, project: str) -> str:
    return client.get(f"/console/api/projects/{project}").json()["balance"]


def _nine_trillion(client) -> str:
    """A new project holding nine payments of a trillion units."""
    project = client.post("/console/api/projects", {"name": "rich"}).json()["id"]
    for n in range(9):
        paid = _pay(client, project, TRILLION, f"INV-{n}")
        assert paid.status_code == 201, paid.text
    assert _balance(client, project) == NINE_TRILLION
    return project


def _refused_as_too_large(response) -> None:
    assert response.status_code == 409 and error_type(response) == "conflict", response.text
    assert "largest amount" in response.json()["error"]["message"]


def test_a_payment_past_64_bits_is_refused_and_the_balance_stays_exact(client):
    project = _nine_trillion(client)
    _refused_as_too_large(_pay(client, project, TRILLION, "INV-9"))
    assert _balance(client, project) == NINE_TRILLION
    assert len(client.get(f"/console/api/projects/{project}/ledger").json()["data"]) == 9
    assert _pay(client, project, "0.000001", "INV-9").status_code == 201  # still free
    assert _balance(client, project) == "9000000000000.000001"


def test_a_purchase_past_64_bits_is_refused(client, chain):
    project = _nine_trillion(client)
    payer = address()
    client.patch(f"/console/api/projects/{project}", {"payer_addresses": [payer]})
    tx = chain.transfer(TOKEN, payer, TREASURY, 300_000_000_000 * 10**6, block=chain.head - 5)
    bought = client.post(f"/console/api/projects/{project}/purchases", {"tx_hash": tx})
    _refused_as_too_large(bought)
    assert _balance(client, project) == NINE_TRILLION
    shown = client.get(f"/console/api/projects/{project}/purchases/{tx}")
    assert shown.json()["status"] == "confirmed"  # verified, never credited


def test_the_cli_refuses_credit_past_64_bits_with_conflict(gateway, client):
    project = _nine_trillion(client)
    for command in (
        ("credit", "add", "--project", project, TRILLION),
        ("payments", "record", "--project", project, TRILLION, "--reference", "INV-9"),
    ):
        with pytest.raises(CliFailed) as refused:
            gateway.cli(*command)
        assert refused.value.code != 0 and refused.value.output["error"]["type"] == "conflict"
    assert _balance(client, project) == NINE_TRILLION
    assert gateway.cli("credit", "add", "--project", project, "0.000001")["credited"]
    assert _balance(client, project) == "9000000000000.000001"
