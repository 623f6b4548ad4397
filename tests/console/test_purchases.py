"""Onchain purchases against a local JSON-RPC double, through a real gateway: verified
transfers credited once, pending while confirmations are missing, and every refusal, a
hostile node's malformed answers among them."""

from __future__ import annotations

import pytest

from tests.console.rpc_double import Chain, RpcDouble, address
from tests.console.support import ConsoleClient, create_user, error_type
from tests.support.gateway_process import GatewayProcess, free_port

TOKEN, TREASURY = address(), address()


def purchases_config(rpc_url: str, decimals: int, usd_per_token: str = "1") -> str:  # noqa: S107
    return f"""
[purchases]
rpc_url = "{rpc_url}"
chain_id = 8453
token_address = "{TOKEN}"
token_decimals = {decimals}
treasury_address = "{TREASURY}"
usd_per_token = "{usd_per_token}"
confirmations = 3
rpc_timeout_s = 3
"""


@pytest.fixture(scope="module")
def chain():
    chain = Chain()
    with RpcDouble(chain) as double:
        chain.url = double.url
        yield chain


def _gateway(folder, extra: str):
    process = GatewayProcess(folder, extra_config=extra).start()
    create_user(process, "owner@example.com")
    return process


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, chain):
    process = _gateway(tmp_path_factory.mktemp("usdc"), purchases_config(chain.url, 6))
    yield process
    process.stop()


@pytest.fixture
def buyer(gateway):
    """(client, project id, its registered payer address)"""
    client = ConsoleClient(gateway)
    client.login("owner@example.com")
    project = client.post("/console/api/projects", {"name": "buyer"}).json()["id"]
    payer = address()
    patched = client.patch(
        f"/console/api/projects/{project}", {"payer_addresses": [payer.upper().replace("0X", "0x")]}
    )
    assert patched.status_code == 200 and patched.json()["payer_addresses"] == [payer]
    return client, project, payer


def _buy(client, project: str, tx_hash: str):
    return client.post(f"/console/api/projects/{project}/purchases", {"tx_hash": tx_hash})


def test_a_confirmed_transfer_is_credited_once(chain, buyer):
    client, project, payer = buyer
    tx = chain.transfer(TOKEN, payer, TREASURY, 12_345_678, block=chain.head - 5)
    bought = _buy(client, project, tx)
    assert bought.status_code == 201, bought.text
    assert bought.json()["amount"] == "12.345678" and bought.json()["balance"] == "12.345678"
    assert bought.json()["sender"] == payer and bought.json()["token_units"] == "12345678"
    again = _buy(client, project, tx)
    assert again.status_code == 409 and error_type(again) == "conflict"
    shown = client.get(f"/console/api/projects/{project}/purchases/{tx}")
    assert shown.status_code == 200 and shown.json()["status"] == "credited"
    (entry,) = client.get(f"/console/api/projects/{project}/ledger").json()["data"]
    assert entry["kind"] == "purchase" and entry["reference"] == tx
    assert client.get(f"/console/api/projects/{project}").json()["balance"] == "12.345678"


def test_pending_until_enough_confirmations(chain, buyer):
    client, project, payer = buyer
    tx = chain.transfer(TOKEN, payer, TREASURY, 2_000_000, block=chain.head)  # 1 of 3
    pending = _buy(client, project, tx)
    assert pending.status_code == 202 and int(pending.headers["retry-after"]) > 0
    assert pending.json()["status"] == "pending" and pending.json()["confirmations"] == 1
    assert client.get(f"/console/api/projects/{project}").json()["balance"] == "0.000000"
    chain.head += 2
    done = _buy(client, project, tx)
    assert done.status_code == 201 and done.json()["amount"] == "2.000000"
    assert _buy(client, project, tx).status_code == 409
    unmined = _buy(client, project, "0x" + "ab" * 32)
    assert unmined.status_code == 202 and unmined.json()["confirmations"] == 0


@pytest.mark.parametrize(
    ("case", "status", "kind"),
    [
        ("wrong token", 400, "invalid_request"),
        ("wrong recipient", 400, "invalid_request"),
        ("reverted", 400, "invalid_request"),
        ("unregistered sender", 403, "forbidden"),
    ],
)
def test_transfers_that_are_not_ours_are_refused(chain, buyer, case, status, kind):
    client, project, payer = buyer
    token, sender, to, state = TOKEN, payer, TREASURY, "0x1"
    if case == "wrong token":
        token = address()
    elif case == "wrong recipient":
        to = address()
    elif case == "reverted":
        state = "0x0"
    else:
        sender = address()
    tx = chain.transfer(token, sender, to, 5_000_000, block=chain.head - 10, status=state)
    refused = _buy(client, project, tx)
    assert refused.status_code == status and error_type(refused) == kind, refused.text
    assert client.get(f"/console/api/projects/{project}").json()["balance"] == "0.000000"


def test_nobody_claims_another_projects_payment(chain, gateway, buyer):
    client, project, payer = buyer
    thief = client.post("/console/api/projects", {"name": "thief"}).json()["id"]
    tx = chain.transfer(TOKEN, payer, TREASURY, 1_000_000, block=chain.head - 10)
    assert _buy(client, thief, tx).status_code == 403  # not the thief's payer address
    assert _buy(client, project, tx).status_code == 201
    assert _buy(client, thief, tx).status_code == 409
    other = client.get(f"/console/api/projects/{thief}/purchases/{tx}")
    assert other.status_code == 404


def test_a_get_reports_a_purchase_and_never_credits_it(chain, buyer):
    """GET skips the Origin check, so it must not change anything: it says a confirmed
    transfer is there to be credited, and only a POST credits it."""
    client, project, payer = buyer
    tx = chain.transfer(TOKEN, payer, TREASURY, 3_000_000, block=chain.head - 5)
    shown = client.get(f"/console/api/projects/{project}/purchases/{tx}")
    assert shown.status_code == 200, shown.text
    assert shown.json()["status"] == "confirmed" and shown.json()["amount"] == "3.000000"
    assert client.get(f"/console/api/projects/{project}").json()["balance"] == "0.000000"
    assert client.get(f"/console/api/projects/{project}/ledger").json()["data"] == []
    assert _buy(client, project, tx).status_code == 201
    credited = client.get(f"/console/api/projects/{project}/purchases/{tx}")
    assert credited.json()["status"] == "credited"
    assert client.get(f"/console/api/projects/{project}").json()["balance"] == "3.000000"


def test_an_address_belongs_to_one_project(chain, buyer):
    """Another project registering a held payer address is refused, so it cannot claim
    the holder's transfers; once the holder lets the address go, it may take it."""
    client, victim, payer = buyer
    thief = client.post("/console/api/projects", {"name": "thief"}).json()["id"]
    mine = address()
    assert client.patch(f"/console/api/projects/{thief}", {"payer_addresses": [mine]}).is_success
    taken = client.patch(
        f"/console/api/projects/{thief}", {"payer_addresses": [mine, payer], "rpm": 7}
    )
    assert taken.status_code == 409 and error_type(taken) == "conflict", taken.text
    assert taken.json()["error"]["param"] == "payer_addresses"
    assert "archived" not in taken.json()["error"]["message"]  # it is not
    assert client.get(f"/console/api/projects/{thief}").json()["rpm"] != 7  # nothing changed
    assert client.get(f"/console/api/projects/{thief}").json()["payer_addresses"] == [mine]
    tx = chain.transfer(TOKEN, payer, TREASURY, 1_000_000, block=chain.head - 10)
    assert _buy(client, thief, tx).status_code == 403
    # The holder saving its own list again is no conflict.
    kept = client.patch(f"/console/api/projects/{victim}", {"payer_addresses": [payer]})
    assert kept.status_code == 200
    assert _buy(client, victim, tx).status_code == 201
    assert client.get(f"/console/api/projects/{thief}").json()["balance"] == "0.000000"
    client.patch(f"/console/api/projects/{victim}", {"payer_addresses": []})
    moved = client.patch(f"/console/api/projects/{thief}", {"payer_addresses": [payer]})
    assert moved.status_code == 200 and moved.json()["payer_addresses"] == [payer]


def _answer(result) -> dict:
    return {"jsonrpc": "2.0", "id": 1, "result": result}


@pytest.fixture
def hostile(chain):
    """The chain's hostile answers, cleared after the test."""
    yield chain.hostile
    chain.hostile.clear()


@pytest.mark.parametrize(
    "case",
    [
        "chain id as a JSON number",
        "block number as a JSON number",
        "a negative block number",
        "an answer that is not an object",
        "a negative transfer value",
        "a transfer past 64-bit micro-units",
    ],
)
def test_a_malformed_node_answer_is_503_and_credits_nothing(chain, buyer, hostile, case):
    client, project, payer = buyer
    units, data = 4_000_000, None
    if case == "chain id as a JSON number":
        hostile["eth_chainId"] = _answer(chain.chain_id)
    elif case == "block number as a JSON number":
        hostile["eth_blockNumber"] = _answer(chain.head)
    elif case == "a negative block number":
        hostile["eth_blockNumber"] = _answer("-0x5")
    elif case == "an answer that is not an object":
        hostile["eth_chainId"] = 5
    elif case == "a negative transfer value":
        data = "-0x5"
    else:
        units = 2**63  # micro-units at 6 decimals and 1 USD per token
    tx = chain.transfer(TOKEN, payer, TREASURY, units, block=chain.head - 10, data=data)
    refused = _buy(client, project, tx)
    assert refused.status_code == 503, refused.text
    assert error_type(refused) == "service_unavailable"
    assert "already" not in refused.json()["error"]["message"]  # never another refusal's
    shown = client.get(f"/console/api/projects/{project}/purchases/{tx}")
    assert shown.status_code == 503
    assert client.get(f"/console/api/projects/{project}").json()["balance"] == "0.000000"
    assert client.get(f"/console/api/projects/{project}/ledger").json()["data"] == []


def test_bad_input_and_archived_projects(chain, buyer):
    client, project, _ = buyer
    assert _buy(client, project, "0x1234").status_code == 400
    bad = client.patch(f"/console/api/projects/{project}", {"payer_addresses": ["0xnothex"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "payer_addresses.0"
    client.post(f"/console/api/projects/{project}/archive")
    assert _buy(client, project, "0x" + "cd" * 32).status_code == 409


def test_eighteen_decimals_round_down_to_micro_units(tmp_path, chain):
    gateway = _gateway(tmp_path, purchases_config(chain.url, 18, usd_per_token="0.9998"))
    try:
        client = ConsoleClient(gateway)
        client.login("owner@example.com")
        project = client.post("/console/api/projects", {"name": "dai"}).json()["id"]
        payer = address()
        client.patch(f"/console/api/projects/{project}", {"payer_addresses": [payer]})
        # 123.456789012345678901 tokens x 0.9998 USD = 123.432097654543209765... USD
        tx = chain.transfer(
            TOKEN, payer, TREASURY, 123_456_789_012_345_678_901, block=chain.head - 3
        )
        bought = _buy(client, project, tx)
        assert bought.status_code == 201, bought.text
        assert bought.json()["amount"] == "123.432097"
    finally:
        gateway.stop()


def test_an_unreachable_node_is_503_with_retry_after(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = _gateway(tmp_path, purchases_config(dead, 6))
    try:
        client = ConsoleClient(gateway)
        client.login("owner@example.com")
        project = client.post("/console/api/projects", {"name": "offline"}).json()["id"]
        refused = _buy(client, project, "0x" + "ef" * 32)
        assert refused.status_code == 503 and error_type(refused) == "service_unavailable"
        assert int(refused.headers["retry-after"]) > 0
    finally:
        gateway.stop()


def test_the_overview_page_offers_purchases_when_configured(buyer):
    client, project, payer = buyer
    page = client.get(f"/console/projects/{project}")
    assert page.status_code == 200
    assert "Credit an onchain purchase" in page.text and payer in page.text
