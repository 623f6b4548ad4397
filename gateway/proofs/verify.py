"""Offline verification of a proof document, for `gateway verify FILE_OR_URL`.

Every public receipt version the gateway ever logged verifies the same way: the signature
and the leaf cover the receipt's canonical bytes, whatever fields its version has.

Without a trusted public key, a valid result shows only that the document is internally
consistent: whoever made it holds the key it names. Pass the key the deployment publishes
at GET /api/proofs/keys to also show that it was this deployment.
"""

from __future__ import annotations

import http.client
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import orjson

from model_gateway.gateway.proofs.checkpoint import open_checkpoint
from model_gateway.gateway.proofs.log_key import key_id, verify_signature
from model_gateway.gateway.proofs.merkle import verify_inclusion
from model_gateway.gateway.proofs.receipts import (
    parse_proof_document,
    receipt_leaf_hash,
    receipt_message,
    tree_head_message,
)

FETCH_TIMEOUT_SECONDS = 10
MAX_DOCUMENT_BYTES = 1 << 20


class DocumentError(Exception):
    """The document could not be read, or is not a JSON object."""


class VerifyResult(msgspec.Struct, kw_only=True):
    ok: bool
    reasons: list[str]  # empty when ok
    key_trusted: bool = False  # the signing key was checked against a trusted key
    receipt_id: str | None = None
    leaf_index: int | None = None
    tree_size: int | None = None
    root_hash: str | None = None
    key_id: str | None = None


def verify_proof_document(doc: object, trusted_public_key: bytes | None = None) -> VerifyResult:
    try:
        proof = parse_proof_document(doc)  # either receipt version, by its "v"
    except msgspec.ValidationError as exc:
        return VerifyResult(ok=False, reasons=[f"malformed proof document: {exc}"])
    public_key = bytes.fromhex(proof.public_key)
    head = proof.tree_head
    # Every check runs, so the reasons name everything that was altered, not just the first.
    checks = [
        (
            trusted_public_key is None or public_key == trusted_public_key,
            "the document is signed by a key other than the trusted one",
        ),
        (key_id(public_key) == proof.key_id, "key_id does not match public_key"),
        (head.key_id == proof.key_id, "the tree head names a different key_id"),
        (
            # Leaves logged before tiles were signed one by one; newer ones are proven by
            # the signed head alone (the inclusion proof ties the receipt to it).
            proof.receipt_signature is None
            or verify_signature(
                public_key, bytes.fromhex(proof.receipt_signature), receipt_message(proof.receipt)
            ),
            "the receipt signature is invalid",
        ),
        (
            verify_signature(public_key, bytes.fromhex(head.signature), tree_head_message(head)),
            "the tree head signature is invalid",
        ),
        (
            verify_inclusion(
                proof.leaf_index,
                head.size,
                receipt_leaf_hash(proof.receipt),
                [bytes.fromhex(h) for h in proof.inclusion_proof],
                bytes.fromhex(head.root_hash),
            ),
            "the inclusion proof does not lead from the receipt to the tree head root",
        ),
    ]
    if proof.checkpoint is not None:
        checkpoint = open_checkpoint(proof.checkpoint, public_key)
        checks.append((checkpoint is not None, "the checkpoint signature is invalid"))
        checks.append(
            (
                checkpoint is None
                or (checkpoint.size, checkpoint.root_hash.hex()) == (head.size, head.root_hash),
                "the checkpoint is not the tree head's size and root",
            )
        )
    reasons = [reason for passed, reason in checks if not passed]
    return VerifyResult(
        ok=not reasons,
        reasons=reasons,
        key_trusted=trusted_public_key is not None,
        receipt_id=proof.receipt.id,
        leaf_index=proof.leaf_index,
        tree_size=head.size,
        root_hash=head.root_hash,
        key_id=proof.key_id,
    )


def load_document(file_or_url: str) -> dict[str, Any]:
    """The JSON object in a file, or served at an http(s) URL."""
    try:
        if file_or_url.startswith(("http://", "https://")):
            raw = _fetch(file_or_url)
        else:
            raw = Path(file_or_url).read_bytes()
        doc = orjson.loads(raw)
    except (OSError, http.client.HTTPException, orjson.JSONDecodeError) as exc:
        # OSError covers urllib's URLError and HTTPError, timeouts and missing files.
        raise DocumentError(f"cannot read {file_or_url}: {exc}") from exc
    if not isinstance(doc, dict):
        raise DocumentError(f"{file_or_url} does not hold a JSON object")
    return doc


def _fetch(url: str) -> bytes:
    # S310 asks for the scheme to be audited: load_document passes only http(s) URLs here.
    # Accept: a proof page URL can then answer with its JSON document.
    request = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_SECONDS) as response:  # noqa: S310
        body: bytes = response.read(MAX_DOCUMENT_BYTES + 1)
    if len(body) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"{url} serves more than {MAX_DOCUMENT_BYTES} bytes")
    return body
