"""Salted commitments through a real `gateway serve`: the project opens them with the
salts on its own receipt; the public proof and page show neither salts nor digests."""

from __future__ import annotations

import hashlib

import orjson

from tests.proofs_e2e.conftest import wait_proof
from tests.support.http import bearer


def pin_chat(http, key: str, pin: str):
    """A chat whose prompt is a PIN, sent as exact bytes: (request body, response)."""
    body = orjson.dumps({"model": "echo-1", "messages": [{"role": "user", "content": pin}]})
    headers = bearer(key) | {"content-type": "application/json"}
    response = http.post("/v1/chat/completions", content=body, headers=headers)
    assert response.status_code == 200, response.text
    return body, response


def test_the_project_opens_both_commitments_with_the_salts_of_its_receipt(http, customer):
    body, response = pin_chat(http, customer.key, "4821")
    receipt_id = response.headers["x-receipt-id"]
    public = wait_proof(http, receipt_id)["receipt"]
    owned = http.get(f"/v1/receipts/{receipt_id}", headers=bearer(customer.key)).json()

    request_salt = bytes.fromhex(owned["request_salt"])
    response_salt = bytes.fromhex(owned["response_salt"])
    assert len(request_salt) == len(response_salt) == 16
    # What the project holds (its request, the response it got, the salts) opens them.
    assert public["request_commitment"] == hashlib.sha256(request_salt + body).hexdigest()
    response_digest = hashlib.sha256(response.content).digest()
    assert public["response_commitment"] == (
        hashlib.sha256(response_salt + response_digest).hexdigest()
    )
    assert owned["request_sha256"] == hashlib.sha256(body).hexdigest()
    assert owned["response_sha256"] == response_digest.hex()
    assert owned["usage_source"] == public["usage_source"] == "provider"


def test_a_pin_cannot_be_guessed_from_the_public_proof_or_page(http, customer):
    """The reproduction of the finding: hash every 4-digit PIN in the request's shape and
    look for it in what anyone can read."""
    body, response = pin_chat(http, customer.key, "0917")
    receipt_id = response.headers["x-receipt-id"]
    proof_text = (wait_proof(http, receipt_id), http.get(f"/api/proofs/{receipt_id}").text)[1]
    page = http.get(f"/proofs/{receipt_id}").text
    guesses = {
        hashlib.sha256(body.replace(b"0917", b"%04d" % pin)).hexdigest(): pin
        for pin in range(10_000)
    }
    assert hashlib.sha256(body).hexdigest() in guesses  # the attack finds a plain digest
    for public in (proof_text, page):
        assert not [pin for digest, pin in guesses.items() if digest in public]
        assert hashlib.sha256(response.content).hexdigest() not in public
    owned = http.get(f"/v1/receipts/{receipt_id}", headers=bearer(customer.key)).json()
    for private in ("request_salt", "response_salt", "request_sha256", "response_sha256"):
        assert owned[private] not in proof_text and owned[private] not in page
