"""Salted commitments to the request and response bodies: what the public receipt (v2)
publishes instead of their plain SHA-256.

A plain digest of a short body can be reversed by guessing (a PIN, "yes", a known
template); a digest over a random 16-byte salt and the body cannot, as long as the salt
stays private. Each receipt gets two salts, one per body, shown only to its project on
GET /v1/receipts/{id}: the project can then open either commitment to a third party
without exposing the other body to guessing.

- request:  SHA-256(request_salt || request body bytes)
- response: SHA-256(response_salt || SHA-256(response body bytes))

The response is committed through its digest because the handlers hash the response as
it streams and never hold the whole body; binding to the digest binds to the body.
"""

from __future__ import annotations

import hashlib
import os

SALT_BYTES = 16


def new_salts() -> tuple[bytes, bytes]:
    """A receipt's two salts (request, response), from one read of the kernel's random
    source: os.urandom, which `secrets` reads too, through two more calls a draw."""
    both = os.urandom(2 * SALT_BYTES)
    return both[:SALT_BYTES], both[SALT_BYTES:]


def request_commitment(salt: bytes, body: bytes) -> str:
    return hashlib.sha256(salt + body).hexdigest()


def response_commitment(salt: bytes, response_sha256: str) -> str:
    """Over the 32 raw bytes of the response body's SHA-256 (given as hex)."""
    return hashlib.sha256(salt + bytes.fromhex(response_sha256)).hexdigest()
