"""A deployment upgraded from public receipt version 1: a real `gateway serve` on the
database and signing key the v1 code left behind (tests/proofs/fixtures/v1). Its logged
receipts keep their v1 proofs, new receipts join the same log as v2, and `gateway verify`
accepts both, from the server and from a file."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import httpx
import pytest

from model_gateway.gateway.proofs.log_key import SigningKey
from tests.proofs_e2e.conftest import chat, verify, wait_proof
from tests.support.gateway_process import GatewayProcess

FIXTURES = Path(__file__).parents[1] / "proofs" / "fixtures" / "v1"


def fixture_public_key() -> str:
    seed = bytes.fromhex((FIXTURES / "signing-key").read_text().strip())
    return SigningKey(seed).public_key.hex()


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory):
    """(gateway, the receipt ids the v1 code logged)."""
    folder = tmp_path_factory.mktemp("upgraded")
    process = GatewayProcess(folder)
    data = folder / "data"
    data.mkdir(mode=0o700)
    with sqlite3.connect(data / "gateway.db") as db:
        db.executescript((FIXTURES / "gateway_v1.sql").read_text())
        old_ids = [row[0] for row in db.execute("SELECT receipt_id FROM log_leaves ORDER BY 1")]
    db.close()
    shutil.copy(FIXTURES / "signing-key", data / "signing-key")
    (data / "signing-key").chmod(0o600)
    with process:
        yield process, old_ids


def test_receipts_logged_before_the_upgrade_keep_their_version_1_proofs(upgraded):
    gateway, old_ids = upgraded
    assert len(old_ids) == 3
    key = fixture_public_key()
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        for receipt_id in old_ids:
            doc = wait_proof(http, receipt_id)
            assert "v" not in doc["receipt"]
            assert set(doc["receipt"]) >= {"request_sha256", "response_sha256"}
            code, report, output = verify(
                f"{gateway.url}/api/proofs/{receipt_id}", "--key", key, "--json"
            )
            assert code == 0, output
            assert report["ok"] and report["key_trusted"]
            page = http.get(f"/proofs/{receipt_id}").text
            assert "Verified:" in page and "Request SHA-256" in page


def test_a_new_receipt_joins_the_same_log_as_version_2(upgraded):
    gateway, old_ids = upgraded
    project = gateway.create_project("after-upgrade", "--balance", "1")
    api_key = gateway.create_key(project, "inference,receipts")
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        receipt_id = chat(http, api_key)
        doc = wait_proof(http, receipt_id)
        old = wait_proof(http, old_ids[0])
        page = http.get(f"/proofs/{receipt_id}").text
    assert doc["receipt"]["v"] == 3 and doc["leaf_index"] >= 3  # priced by class
    assert doc["public_key"] == fixture_public_key() == old["public_key"]
    assert "Request commitment" in page and "Verified:" in page
    code, report, output = verify(
        f"{gateway.url}/api/proofs/{receipt_id}", "--key", fixture_public_key(), "--json"
    )
    assert code == 0, output
    assert report["ok"]


def test_the_proof_saved_by_the_version_1_code_verifies_from_its_file():
    path = str(FIXTURES / "v1_proof.json")
    code, report, output = verify(path, "--key", fixture_public_key(), "--json")
    assert code == 0, output
    assert report["ok"] and report["key_trusted"]
    code, report, _ = verify(path, "--key", "00" * 32, "--json")
    assert code == 1 and not report["ok"]
