"""The proof endpoints in process, with the log integrator held back so that the pending
state can be seen deterministically (through a real server it lasts under 250 ms)."""

from __future__ import annotations

import hashlib
import time

import httpx
import orjson
import pytest

from model_gateway.gateway.app import create_app
from model_gateway.gateway.config import ConfigError, parse_config
from model_gateway.gateway.proofs.checkpoint import open_checkpoint, verifier_key
from model_gateway.gateway.proofs.merkle import leaf_hash
from model_gateway.gateway.proofs.verify import verify_proof_document
from model_gateway.storage import ReceiptRecord
from tests.support.configs import EMBEDDED
from tests.support.records import add_project


@pytest.fixture
async def served(tmp_path):
    app = create_app(parse_config(EMBEDDED, base_dir=tmp_path))
    async with app.lifespan():
        gateway = app.gateway
        gateway.transparency_log._task.cancel()  # integrate only when the test says so
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
            yield gateway, client


async def settled_receipt(gateway) -> str:
    storage = gateway.storage
    project = await add_project(storage, "hidden")
    await storage.add_credit(project.id, 1_000_000, "2025-01")
    reservation = await gateway.meter.reserve(project.id, None, 500)
    receipt_id = "rcpt_" + hashlib.sha256(project.id.encode()).hexdigest()[:24]
    await storage.settle(
        ReceiptRecord(
            id=receipt_id,
            reservation_id=reservation.id,
            project_id=project.id,
            key_id=None,
            request_id="req_x",
            kind="inference",
            endpoint="/v1/chat/completions",
            model_or_runtime="echo-1",
            status="succeeded",
            usage={"input_tokens": 1, "output_tokens": 2},
            cost=42,
            month=reservation.month,
            created_at=time.time_ns() // 1000,
            request_sha256=hashlib.sha256(b"q").hexdigest(),
            response_sha256=hashlib.sha256(b"a").hexdigest(),
        )
    )
    return receipt_id


async def test_a_receipt_waiting_for_the_log_answers_202_pending(served):
    gateway, client = served
    receipt_id = await settled_receipt(gateway)

    response = await client.get(f"/api/proofs/{receipt_id}")
    assert response.status_code == 202
    assert response.headers["retry-after"] == "1"
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["status"] == "pending"
    assert body["receipt_id"] == receipt_id

    page = await client.get(f"/proofs/{receipt_id}")
    assert page.status_code == 202
    assert '<meta http-equiv="refresh" content="1">' in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"

    await gateway.transparency_log.integrate()
    response = await client.get(f"/api/proofs/{receipt_id}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    result = verify_proof_document(response.json(), gateway.signing_key.public_key)
    assert result.ok, result.reasons
    assert response.json()["receipt"]["cost"] == "0.000042"


async def test_healthz_says_the_one_sqlite_process_is_the_log_sequencer(served):
    gateway, client = served
    await settled_receipt(gateway)
    await gateway.transparency_log.integrate()
    detail = (await client.get("/healthz")).json()["log"]
    assert detail == {"sequencer": True, "size": 1}
    assert "gateway_log_sequencer 1.0" in (await client.get("/metrics")).text


async def test_the_page_answers_json_to_a_client_that_asks_only_for_json(served):
    gateway, client = served
    receipt_id = await settled_receipt(gateway)
    await gateway.transparency_log.integrate()
    as_json = await client.get(f"/proofs/{receipt_id}", headers={"accept": "application/json"})
    assert as_json.headers["content-type"].startswith("application/json")
    assert as_json.json()["receipt"]["id"] == receipt_id
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    as_html = await client.get(f"/proofs/{receipt_id}", headers={"accept": browser})
    assert as_html.headers["content-type"].startswith("text/html")
    assert "gateway verify PAGE_URL" in as_html.text


async def test_the_signing_key_is_created_once_and_kept(tmp_path):
    config = parse_config(EMBEDDED, base_dir=tmp_path)
    keys = []
    for _ in range(2):
        app = create_app(config)
        async with app.lifespan():
            keys.append(app.gateway.signing_key.public_key)
    assert keys[0] == keys[1]
    assert (tmp_path / "data" / "signing-key").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    "url", ["gw.example.com", "https://", "javascript:alert(1)", "https://gw.example.com/?a=1"]
)
def test_a_public_url_that_links_cannot_start_with_is_refused_at_start(tmp_path, url):
    with pytest.raises(ConfigError, match=r"server\.public_url"):
        parse_config(f'[server]\npublic_url = "{url}"\n' + EMBEDDED, base_dir=tmp_path)


async def test_links_follow_public_url_not_the_host_header(tmp_path):
    config = '[server]\npublic_url = "https://receipts.example.net/"\n' + EMBEDDED
    app = create_app(parse_config(config, base_dir=tmp_path))
    async with app.lifespan():
        gateway = app.gateway
        receipt_id = await settled_receipt(gateway)
        await gateway.transparency_log.integrate()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://forged.test") as client:
            page = (await client.get(f"/proofs/{receipt_id}")).text
    assert "forged.test" not in page
    assert f"gateway verify https://receipts.example.net/api/proofs/{receipt_id}" in page


async def test_an_empty_log_publishes_the_signed_checkpoint_of_the_empty_tree(served):
    gateway, client = served
    response = await client.get("/api/proofs/log/checkpoint")
    assert response.status_code == 200
    checkpoint = open_checkpoint(response.text, gateway.signing_key.public_key)
    assert (checkpoint.origin, checkpoint.size) == ("gateway.local/log", 0)
    assert checkpoint.root_hash == hashlib.sha256(b"").digest()
    assert (await client.get("/api/proofs/log/tile/0/000.p/1")).status_code == 404
    keys = (await client.get("/api/proofs/keys")).json()["data"][0]
    assert keys["checkpoint_origin"] == "gateway.local/log"
    assert keys["vkey"] == verifier_key("gateway.local/log", gateway.signing_key.public_key)
    # The checkpoint follows the log, and a proof carries the same one.
    receipt_id = await settled_receipt(gateway)
    await gateway.transparency_log.integrate()
    note = (await client.get("/api/proofs/log/checkpoint")).text
    assert open_checkpoint(note, gateway.signing_key.public_key).size == 1
    assert (await client.get(f"/api/proofs/{receipt_id}")).json()["checkpoint"] == note
    tile = await client.get("/api/proofs/log/tile/0/000.p/1")
    assert tile.status_code == 200 and tile.headers["cache-control"] == "public, max-age=60"
    entries = await client.get("/api/proofs/log/tile/entries/000.p/1")
    entry = entries.content[2:]
    assert entries.content[:2] == len(entry).to_bytes(2, "big")
    assert leaf_hash(entry) == tile.content
    assert orjson.loads(entry)["id"] == receipt_id


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/proofs/consistency?first=9223372036854775808", 400),  # beyond storage's ints
        ("/api/proofs/consistency?first=1&second=9999999999999999999", 400),
        ("/api/proofs/log/tile/0/" + "x001/" * 1500 + "001", 404),  # beyond int()'s digits
        ("/api/proofs/log/tile/entries/" + "x001/" * 7 + "001", 404),  # past any tree
    ],
)
async def test_proof_requests_out_of_range_are_refused_not_failed(served, path, status):
    _, client = served
    response = await client.get(path)
    assert response.status_code == status
    if status == 400:
        assert response.json()["error"]["param"] in ("first", "second")
