"""The public receipt, signed tree heads and the proof document.

A receipt's public fields are encoded canonically: JSON with sorted keys, no whitespace,
UTF-8. Those bytes are the receipt's Merkle leaf. Times are RFC 3339 UTC strings with
exactly six fractional digits ("2025-01-02T03:04:05.000120Z"), costs decimal USD strings
with exactly six decimals ("0.000120", see gateway.money.format_amount), hashes and
signatures lowercase hex.

A signature covers a context line followed by the canonical JSON, so a signature made for
one kind of message can never be replayed as another.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

import msgspec
import orjson

from gateway.proofs.merkle import leaf_hash
from gateway.proofs.signing import SigningKey, key_id

RECEIPT_CONTEXT = b"model-gateway receipt v1\n"
TREE_HEAD_CONTEXT = b"model-gateway tree head v1\n"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _matching(regex: str) -> object:
    # \Z, not $: a trailing newline must not pass, and Python's $ lets one through.
    return Annotated[str, msgspec.Meta(pattern=rf"\A{regex}\Z")]


Sha256Hex = _matching("[0-9a-f]{64}")
SignatureHex = _matching("[0-9a-f]{128}")
PublicKeyHex = _matching("[0-9a-f]{64}")
KeyId = _matching("[0-9a-f]{16}")
Timestamp = _matching(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")
Cost = _matching(r"(0|[1-9][0-9]*)\.[0-9]{6}")
ReceiptId = _matching("rcpt_[A-Za-z0-9_-]+")
Count = Annotated[int, msgspec.Meta(ge=0)]


def format_timestamp(unix_micros: int) -> str:
    # Integer arithmetic: a float of unix seconds cannot hold every microsecond.
    moment = _EPOCH + timedelta(microseconds=unix_micros)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# Strict structs: a field added to a signed object must fail verification, never be shown
# beside the signed fields as if it were one of them.
class PublicReceipt(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: ReceiptId
    issued_at: Timestamp
    kind: Literal["inference", "sandbox"]
    endpoint: str
    model_or_runtime: str
    status: Literal["succeeded", "failed"]
    usage: dict[str, Count]
    cost: Cost
    request_sha256: Sha256Hex
    response_sha256: Sha256Hex


class SignedTreeHead(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    size: Count
    root_hash: Sha256Hex
    timestamp: Timestamp
    key_id: KeyId
    signature: SignatureHex


class ProofDocument(msgspec.Struct, frozen=True, kw_only=True):
    receipt: PublicReceipt
    receipt_signature: SignatureHex
    key_id: KeyId
    public_key: PublicKeyHex
    leaf_index: Count
    inclusion_proof: list[Sha256Hex]
    tree_head: SignedTreeHead


def _canonical(value: object) -> bytes:
    return orjson.dumps(msgspec.to_builtins(value), option=orjson.OPT_SORT_KEYS)


def canonical_bytes(receipt: PublicReceipt) -> bytes:
    return _canonical(receipt)


def receipt_leaf_hash(receipt: PublicReceipt) -> bytes:
    """The receipt's entry in the log: the RFC 9162 leaf hash of its canonical bytes."""
    return leaf_hash(canonical_bytes(receipt))


def receipt_message(receipt: PublicReceipt) -> bytes:
    return RECEIPT_CONTEXT + canonical_bytes(receipt)


def sign_receipt(key: SigningKey, receipt: PublicReceipt) -> str:
    return key.sign(receipt_message(receipt)).hex()


def tree_head_message(head: SignedTreeHead) -> bytes:
    signed = {f: getattr(head, f) for f in head.__struct_fields__ if f != "signature"}
    return TREE_HEAD_CONTEXT + _canonical(signed)


def sign_tree_head(key: SigningKey, size: int, root_hash: bytes, timestamp: str) -> SignedTreeHead:
    unsigned = SignedTreeHead(
        size=size,
        root_hash=root_hash.hex(),
        timestamp=timestamp,
        key_id=key.key_id,
        signature="",
    )
    return msgspec.structs.replace(unsigned, signature=key.sign(tree_head_message(unsigned)).hex())


def proof_document(
    *,
    receipt: PublicReceipt,
    receipt_signature: str,
    public_key: bytes,
    leaf_index: int,
    inclusion_proof: list[bytes],
    tree_head: SignedTreeHead,
) -> ProofDocument:
    """What GET /api/proofs/{receipt_id} serves (encode with msgspec.json.encode)."""
    return ProofDocument(
        receipt=receipt,
        receipt_signature=receipt_signature,
        key_id=key_id(public_key),
        public_key=public_key.hex(),
        leaf_index=leaf_index,
        inclusion_proof=[h.hex() for h in inclusion_proof],
        tree_head=tree_head,
    )
