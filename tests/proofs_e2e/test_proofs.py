"""Receipts to proofs through a real `gateway serve`: the proof API, the public page, the
keys and consistency endpoints, and `gateway verify URL`."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets

import pytest

from model_gateway.gateway.proofs.log_key import key_id, verify_signature
from model_gateway.gateway.proofs.merkle import verify_consistency
from model_gateway.gateway.proofs.receipts import SignedTreeHead, tree_head_message
from tests.proofs_e2e.conftest import chat, verify, wait_proof
from tests.support.errors import assert_error
from tests.support.http import bearer


def server_key(http) -> bytes:
    return bytes.fromhex(http.get("/api/proofs/keys").json()["data"][0]["public_key"])


def test_a_billed_chat_has_a_proof_that_gateway_verify_accepts(gateway, http, customer):
    receipt_id = chat(http, customer.key)
    doc = wait_proof(http, receipt_id)
    assert doc["receipt"]["id"] == receipt_id
    assert doc["receipt"]["model_or_runtime"] == "echo-1"
    assert doc["receipt"]["endpoint"] == "/v1/chat/completions"
    assert doc["receipt"]["status"] == "succeeded"
    # The proof shows what the owner's receipt shows.
    owned = http.get(f"/v1/receipts/{receipt_id}", headers=bearer(customer.key)).json()
    assert owned["proof_url"] == f"/api/proofs/{receipt_id}"
    assert doc["receipt"]["v"] == 3  # an inference receipt priced by class
    assert doc["receipt"]["prices"] == owned["prices"]
    for field in ("cost", "usage", "usage_source", "request_commitment", "response_commitment"):
        assert doc["receipt"][field] == owned[field]
    assert doc["receipt"]["issued_at"] == owned["created_at"]

    code, report, output = verify(f"{gateway.url}/api/proofs/{receipt_id}", "--json")
    assert code == 3, output  # valid, against a key that is trust on first use only
    assert report["ok"] is True and report["key_trusted"] is False
    assert report["reasons"] == []
    assert report["receipt_id"] == receipt_id
    assert report["key_source"] == "server"
    assert report["keys_url"] == f"{gateway.url}/api/proofs/keys"
    assert "trust on first use" in report["key_source_detail"]

    code, _, output = verify(f"{gateway.url}/api/proofs/{receipt_id}")
    assert code == 3, output
    assert output.startswith(f"signature valid, key not trusted: receipt {receipt_id}")
    assert "fetched from the server (trust on first use)" in output


def test_the_page_url_verifies_too(gateway, http, customer):
    receipt_id = chat(http, customer.key)
    wait_proof(http, receipt_id)
    # gateway verify asks for JSON; the page answers the document then.
    code, report, output = verify(f"{gateway.url}/proofs/{receipt_id}", "--json")
    assert code == 3, output  # the server's own key: valid, not trusted
    assert report["ok"] and report["key_source"] == "server"


def test_verify_with_the_key_given_out_of_band(gateway, http, customer):
    receipt_id = chat(http, customer.key)
    wait_proof(http, receipt_id)
    url = f"{gateway.url}/api/proofs/{receipt_id}"
    code, report, _ = verify(url, "--key", server_key(http).hex(), "--json")
    assert code == 0
    assert report["ok"] and report["key_trusted"] and report["key_source"] == "argument"
    other = secrets.token_bytes(32).hex()
    code, report, output = verify(url, "--key", other, "--json")
    assert code == 1, output
    assert report["ok"] is False
    assert "the document is signed by a key other than the trusted one" in report["reasons"]


def test_an_unknown_receipt_is_not_found(gateway, http):
    assert_error(http.get("/api/proofs/rcpt_doesnotexist"), 404, "not_found")
    code, report, _ = verify(f"{gateway.url}/api/proofs/rcpt_doesnotexist", "--json")
    assert code == 2
    assert report["ok"] is False and report["checked"] is False
    page = http.get("/proofs/rcpt_doesnotexist")
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]


def test_proofs_need_no_key_and_ignore_one(http, customer):
    receipt_id = chat(http, customer.key)
    wait_proof(http, receipt_id)
    assert http.get(f"/api/proofs/{receipt_id}", headers=bearer("proj_live_bad")).status_code == 200
    assert http.get(f"/proofs/{receipt_id}").status_code == 200
    assert http.get("/api/proofs/keys").status_code == 200


def test_the_keys_endpoint_publishes_the_signing_key(http, customer):
    receipt_id = chat(http, customer.key)
    doc = wait_proof(http, receipt_id)
    body = http.get("/api/proofs/keys").json()
    assert body["object"] == "list"
    [key] = body["data"]
    assert key["algorithm"] == "ed25519"
    assert key["key_id"] == key_id(bytes.fromhex(key["public_key"]))
    assert key["public_key"] == doc["public_key"]
    assert key["key_id"] == doc["key_id"] == doc["tree_head"]["key_id"]


def test_the_public_proof_and_page_reveal_no_prompt_output_key_or_project(http, customer):
    marker = "MARKER-" + secrets.token_hex(12)
    receipt_id = chat(http, customer.key, f"my secret prompt {marker}")
    doc_text = (wait_proof(http, receipt_id), http.get(f"/api/proofs/{receipt_id}").text)[1]
    page = http.get(f"/proofs/{receipt_id}").text
    keys = http.get("/api/proofs/keys").text
    prefix = customer.key[:18]
    for public in (doc_text, page, keys):
        for secret in (marker, customer.key, prefix, customer.project_name, customer.project_id):
            assert secret not in public
    # The echo model returned the marker: the output is absent, not just the prompt.
    assert "secret prompt" not in doc_text and "secret prompt" not in page


def test_the_page_shows_the_bill_the_verdict_and_how_to_check(gateway, http, customer):
    receipt_id = chat(http, customer.key)
    doc = wait_proof(http, receipt_id)
    response = http.get(f"/proofs/{receipt_id}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    page = response.text
    assert f"{doc['receipt']['cost']} USD" in page
    assert doc["receipt"]["issued_at"] in page
    assert "Verified:" in page
    # No public_url configured: the command names the page, links are relative.
    assert "gateway verify PAGE_URL" in page
    assert f'href="/api/proofs/{receipt_id}"' in page
    assert gateway.url not in page
    assert doc["receipt"]["request_commitment"] in page
    assert doc["tree_head"]["root_hash"] in page
    assert doc["public_key"] in page


def test_the_page_is_locked_down(http, customer):
    receipt_id = chat(http, customer.key)
    wait_proof(http, receipt_id)
    response = http.get(f"/proofs/{receipt_id}")
    csp = response.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    assert "script-src" not in directives  # falls back to default-src 'none'
    assert response.headers["x-content-type-options"] == "nosniff"
    page = response.text
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//(?!127\.0\.0\.1)""", page)
    # The only stylesheet is the inline one, allowed by its hash.
    [style] = re.findall(r"<style>(.*?)</style>", page, re.S)
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert directives["style-src"] == f"'sha256-{digest}'"


def test_the_page_escapes_what_it_echoes(http):
    response = http.get("/proofs/%3Cscript%3Ealert(1)%3C%5Cscript%3E%22%27")
    assert response.status_code == 404
    assert "<script>" not in response.text
    assert "&lt;script&gt;alert(1)&lt;\\script&gt;&quot;&#x27;" in response.text


def _checked_head(raw: dict, public_key: bytes) -> SignedTreeHead:
    head = SignedTreeHead(**raw)
    assert verify_signature(public_key, bytes.fromhex(head.signature), tree_head_message(head))
    return head


def test_a_consistency_proof_links_an_old_head_to_a_newer_one(http, customer):
    old = wait_proof(http, chat(http, customer.key))["tree_head"]
    for _ in range(3):
        receipt_id = chat(http, customer.key)
    new = wait_proof(http, receipt_id)["tree_head"]
    assert new["size"] > old["size"]
    public_key = server_key(http)

    response = http.get(
        "/api/proofs/consistency", params={"first": old["size"], "second": new["size"]}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    first = _checked_head(body["first_tree_head"], public_key)
    second = _checked_head(body["second_tree_head"], public_key)
    assert (first.size, first.root_hash) == (old["size"], old["root_hash"])
    assert (second.size, second.root_hash) == (new["size"], new["root_hash"])
    proof = [bytes.fromhex(h) for h in body["consistency_proof"]]
    assert verify_consistency(
        first.size,
        second.size,
        bytes.fromhex(first.root_hash),
        bytes.fromhex(second.root_hash),
        proof,
    )
    # A proof for other roots does not pass.
    assert not verify_consistency(
        first.size, second.size, bytes.fromhex(first.root_hash), bytes(32), proof
    )

    # Without `second`: to the latest head.
    latest = http.get("/api/proofs/consistency", params={"first": old["size"]}).json()
    assert latest["second"] >= new["size"]
    assert verify_consistency(
        old["size"],
        latest["second"],
        bytes.fromhex(old["root_hash"]),
        bytes.fromhex(latest["second_tree_head"]["root_hash"]),
        [bytes.fromhex(h) for h in latest["consistency_proof"]],
    )


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({}, "first"),
        ({"first": "abc"}, "first"),
        ({"first": "-1"}, "first"),
        ({"first": "1.5"}, "first"),
        ({"first": "0"}, "first"),
        ({"first": "99999999999"}, "first"),
        ({"first": "HEAD", "second": "x"}, "second"),
        ({"first": "HEAD", "second": "99999999999"}, "second"),
        ({"first": "1" + "0" * 40}, "first"),
    ],
)
def test_bad_consistency_sizes_are_invalid_request(http, customer, query, param):
    head = wait_proof(http, chat(http, customer.key))["tree_head"]
    query = {name: str(head["size"]) if v == "HEAD" else v for name, v in query.items()}
    response = http.get("/api/proofs/consistency", params=query)
    assert_error(response, 400, "invalid_request", param=param)


def test_second_below_first_is_invalid_request(http, customer):
    for _ in range(2):
        head = wait_proof(http, chat(http, customer.key))["tree_head"]
    query = {"first": head["size"], "second": 1}
    assert_error(
        http.get("/api/proofs/consistency", params=query), 400, "invalid_request", param="second"
    )
