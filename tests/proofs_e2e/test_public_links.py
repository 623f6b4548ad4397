"""Links on the public proof page and the receipt's proof_url: from `[server] public_url`,
else relative to this server behind its mount prefix; never from the Host header."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from model_gateway.gateway.app import create_app
from model_gateway.gateway.config import load_config
from tests.proofs_e2e.conftest import chat, verify, wait_proof
from tests.support.gateway_process import GatewayProcess, free_port
from tests.support.http import bearer, chat_body

FORGED_HOST = "attacker.example:4443"
PUBLIC_URL = "https://proofs.example.org/gw"


def assert_nothing_from_the_host(text: str) -> None:
    assert "attacker.example" not in text
    assert ":4443" not in text  # with its colon: a hash may hold the digits by chance


def test_a_forged_host_never_appears_on_the_page_or_the_receipt(gateway, http, customer):
    receipt_id = chat(http, customer.key)
    wait_proof(http, receipt_id)
    forged = {"host": FORGED_HOST}
    page = http.get(f"/proofs/{receipt_id}", headers=forged)
    assert page.status_code == 200
    assert_nothing_from_the_host(page.text)
    assert gateway.url not in page.text  # no public_url: no absolute link at all
    assert f'href="/api/proofs/{receipt_id}"' in page.text
    assert 'href="/api/proofs/keys"' in page.text
    owned = http.get(f"/v1/receipts/{receipt_id}", headers=bearer(customer.key) | forged)
    assert owned.json()["proof_url"] == f"/api/proofs/{receipt_id}"


@pytest.fixture(scope="module")
def public(tmp_path_factory):
    """A deployment whose operator set [server] public_url."""
    process = GatewayProcess(tmp_path_factory.mktemp("public-url"))
    config = process.config_path.read_text()
    process.config_path.write_text(
        config.replace("[server]\n", f'[server]\npublic_url = "{PUBLIC_URL}/"\n', 1)
    )
    with process:
        project = process.create_project("public-url", "--balance", "1")
        process.key = process.create_key(project, "inference,receipts")
        yield process


def test_with_public_url_links_and_the_command_use_it_whatever_the_host(public):
    with httpx.Client(base_url=public.url, timeout=30) as http:
        receipt_id = chat(http, public.key)
        wait_proof(http, receipt_id)
        page = http.get(f"/proofs/{receipt_id}", headers={"host": FORGED_HOST}).text
        owned = http.get(
            f"/v1/receipts/{receipt_id}", headers=bearer(public.key) | {"host": FORGED_HOST}
        ).json()
    assert_nothing_from_the_host(page)
    proof_url = f"{PUBLIC_URL}/api/proofs/{receipt_id}"  # the trailing slash is dropped
    assert f"<pre>gateway verify {proof_url}</pre>" in page
    assert f'href="{proof_url}"' in page
    assert f'href="{PUBLIC_URL}/api/proofs/keys"' in page
    assert f'href="{PUBLIC_URL}/proofs/{receipt_id}"' in page
    assert "PAGE_URL" not in page
    assert owned["proof_url"] == proof_url


@contextlib.asynccontextmanager
async def mounted_under_llm(deployment: GatewayProcess):
    """The gateway mounted at /llm in a host app, served by uvicorn on loopback."""
    app = create_app(load_config(deployment.config_path))
    host = Starlette(routes=[Mount("/llm", app=app)], lifespan=app.lifespan)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(host, host="127.0.0.1", port=port, lifespan="on", log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(400):
            if server.started or serving.done():
                break
            await asyncio.sleep(0.025)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 15)


async def test_under_a_mount_prefix_proof_url_and_links_keep_the_prefix(tmp_path):
    deployment = GatewayProcess(tmp_path)  # config and CLI only; uvicorn serves it here
    project = deployment.create_project("mounted", "--balance", "1")
    key = deployment.create_key(project, "inference,receipts")
    async with (
        mounted_under_llm(deployment) as origin,
        httpx.AsyncClient(base_url=origin, timeout=30) as http,
    ):
        response = await http.post(
            "/llm/v1/chat/completions", json=chat_body(), headers=bearer(key)
        )
        assert response.status_code == 200, response.text
        receipt_id = response.headers["x-receipt-id"]
        owned = (await http.get(f"/llm/v1/receipts/{receipt_id}", headers=bearer(key))).json()
        assert owned["proof_url"] == f"/llm/api/proofs/{receipt_id}"
        for _ in range(200):  # the log integrates within a second
            proof = await http.get(owned["proof_url"])
            if proof.status_code == 200:
                break
            await asyncio.sleep(0.02)
        assert proof.status_code == 200, proof.text
        assert proof.json()["receipt"]["id"] == receipt_id

        page = (await http.get(f"/llm/proofs/{receipt_id}", headers={"host": FORGED_HOST})).text
        assert_nothing_from_the_host(page)
        assert f'href="/llm/api/proofs/{receipt_id}"' in page
        assert 'href="/llm/api/proofs/keys"' in page
        # The command line, run while the server answers (so not on its event loop).
        code, report, output = await asyncio.to_thread(
            verify, f"{origin}/llm/proofs/{receipt_id}", "--json"
        )
        assert code == 3, output  # valid against the key the server publishes: not trusted
        assert report["keys_url"] == f"{origin}/llm/api/proofs/keys"
