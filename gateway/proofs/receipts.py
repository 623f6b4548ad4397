"""The public receipt, signed tree heads and the proof document.

A receipt's public fields are encoded canonically: JSON with sorted keys, no whitespace,
UTF-8. Those bytes are the receipt's Merkle leaf. Times are RFC 3339 UTC strings with
exactly six fractional digits ("2025-01-02T03:04:05.000120Z"), costs decimal USD strings
with exactly six decimals ("0.000120", see gateway.money.format_amount), hashes and
signatures lowercase hex.

A signature covers a context line followed by the canonical JSON, so a signature made for
one kind of message can never be replayed as another.

Versions: leaves already in the log never change, so every version ever logged stays
readable. Version 1 (no "v" field) published plain SHA-256 digests of the bodies; version
2 ("v": 2) publishes salted commitments instead (see commitments.py), `usage_source`, and
allows the `cancelled` status. Version 3 ("v": 3, inference receipts priced by token
class) adds the usage by class (`cached_input_tokens`, `cache_write_tokens`,
`reasoning_tokens` within `input_tokens` and `output_tokens`) and `prices`: each class's
price as applied, USD per million tokens. A receipt's version is its own "v" field,
never a guess: the strict structs refuse a v1 leaf with a "v" and a v2 leaf without one.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Generic, Literal, TypeAlias, TypeVar, cast

import msgspec
import orjson

from model_gateway.gateway.proofs.log_key import SigningKey, key_id
from model_gateway.gateway.proofs.merkle import leaf_hash

RECEIPT_CONTEXT = b"model-gateway receipt v1\n"
TREE_HEAD_CONTEXT = b"model-gateway tree head v1\n"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _matching(regex: str) -> msgspec.Meta:
    # \Z, not $: a trailing newline must not pass, and Python's $ lets one through.
    return msgspec.Meta(pattern=rf"\A{regex}\Z")


Sha256Hex: TypeAlias = Annotated[str, _matching("[0-9a-f]{64}")]
SignatureHex: TypeAlias = Annotated[str, _matching("[0-9a-f]{128}")]
PublicKeyHex: TypeAlias = Annotated[str, _matching("[0-9a-f]{64}")]
KeyId: TypeAlias = Annotated[str, _matching("[0-9a-f]{16}")]
Timestamp: TypeAlias = Annotated[
    str, _matching(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")
]
Cost: TypeAlias = Annotated[str, _matching(r"(0|[1-9][0-9]*)\.[0-9]{6}")]
ReceiptId: TypeAlias = Annotated[str, _matching("rcpt_[A-Za-z0-9_-]+")]
Count: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]


def format_timestamp(unix_micros: int) -> str:
    # Integer arithmetic: a float of unix seconds cannot hold every microsecond.
    seconds, micros = divmod(unix_micros, 1_000_000)
    return f"{_format_second(seconds)}.{micros:06d}Z"


@functools.lru_cache(maxsize=16)
def _format_second(unix_seconds: int) -> str:
    # strftime costs ~3 µs a receipt; receipts issued in the same second share it.
    return (_EPOCH + timedelta(seconds=unix_seconds)).strftime("%Y-%m-%dT%H:%M:%S")


# Strict structs: a field added to a signed object must fail verification, never be shown
# beside the signed fields as if it were one of them.
class PublicReceiptV1(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Leaves logged before salted commitments: plain digests of the bodies."""

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


class PublicReceipt(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The current public receipt, version 2: what every new leaf holds."""

    v: Literal[2] = 2  # encoded even though it is the default: it names the version
    id: ReceiptId
    issued_at: Timestamp
    kind: Literal["inference", "sandbox"]
    endpoint: str
    model_or_runtime: str
    status: Literal["succeeded", "failed", "cancelled"]
    usage: dict[str, Count]
    usage_source: Literal["provider", "gateway"]  # who counted the usage
    cost: Cost
    request_commitment: Sha256Hex
    response_commitment: Sha256Hex


# A price per million tokens, decimal USD with six decimals as costs are.
Price: TypeAlias = Cost


class PublicReceiptV3(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Version 3: an inference receipt priced by token class (decisions.md, "Prices,
    exactly"): the usage by class and the price of each class as applied."""

    v: Literal[3] = 3
    id: ReceiptId
    issued_at: Timestamp
    kind: Literal["inference"]
    endpoint: str
    model_or_runtime: str
    status: Literal["succeeded", "failed", "cancelled"]
    usage: dict[str, Count]
    usage_source: Literal["provider", "gateway"]
    prices: dict[str, Price]
    cost: Cost
    request_commitment: Sha256Hex
    response_commitment: Sha256Hex


AnyPublicReceipt = PublicReceiptV1 | PublicReceipt | PublicReceiptV3
_VERSIONS: dict[int, type[PublicReceipt] | type[PublicReceiptV3]] = {
    2: PublicReceipt,
    3: PublicReceiptV3,
}


def receipt_from_builtins(value: object) -> AnyPublicReceipt:
    """The public receipt of whichever version `value` (decoded JSON) says it is.
    Raises msgspec.ValidationError for anything else, an unknown version included."""
    if not isinstance(value, dict):
        raise msgspec.ValidationError("a public receipt must be a JSON object")
    if "v" not in value:
        return msgspec.convert(value, PublicReceiptV1)
    version = value["v"]
    # type() and not ==: True == 1 and 2.0 == 2 in Python, and neither is a version.
    if type(version) is not int or version not in _VERSIONS:
        raise msgspec.ValidationError(f"unknown public receipt version {version!r}")
    return msgspec.convert(value, _VERSIONS[version])


def decode_receipt(leaf: bytes) -> AnyPublicReceipt:
    """A stored leaf's public receipt."""
    return receipt_from_builtins(msgspec.json.decode(leaf))


class SignedTreeHead(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    size: Count
    root_hash: Sha256Hex
    timestamp: Timestamp
    key_id: KeyId
    signature: SignatureHex


R = TypeVar("R")


# Generic in the receipt: a document is read with the receipt left as decoded JSON, which
# receipt_from_builtins then types by its version (msgspec cannot tell two untagged
# structs apart in a union).
class ProofDocument(msgspec.Struct, Generic[R], frozen=True, kw_only=True, omit_defaults=True):
    receipt: R
    # Only leaves logged before tiles carry a signature of their own; the signed tree
    # head and the inclusion proof are what prove a receipt (absent: not encoded).
    receipt_signature: SignatureHex | None = None
    key_id: KeyId
    public_key: PublicKeyHex
    leaf_index: Count
    inclusion_proof: list[Sha256Hex]
    tree_head: SignedTreeHead
    # The same head as a C2SP checkpoint (signed note), the form monitors and witnesses read.
    checkpoint: str | None = None


def _canonical(value: object) -> bytes:
    return orjson.dumps(msgspec.to_builtins(value), option=orjson.OPT_SORT_KEYS)


def canonical_bytes(receipt: AnyPublicReceipt) -> bytes:
    return _canonical(receipt)


def receipt_leaf_hash(receipt: AnyPublicReceipt) -> bytes:
    """The receipt's entry in the log: the RFC 9162 leaf hash of its canonical bytes."""
    return leaf_hash(canonical_bytes(receipt))


def receipt_message(receipt: AnyPublicReceipt) -> bytes:
    return RECEIPT_CONTEXT + canonical_bytes(receipt)


def sign_receipt(key: SigningKey, receipt: AnyPublicReceipt) -> str:
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
    receipt: AnyPublicReceipt,
    receipt_signature: str | None,
    public_key: bytes,
    leaf_index: int,
    inclusion_proof: list[bytes],
    tree_head: SignedTreeHead,
    checkpoint: str | None = None,
) -> ProofDocument[AnyPublicReceipt]:
    """What GET /api/proofs/{receipt_id} serves (encode with msgspec.json.encode)."""
    return ProofDocument(
        receipt=receipt,
        receipt_signature=receipt_signature,
        key_id=key_id(public_key),
        public_key=public_key.hex(),
        leaf_index=leaf_index,
        inclusion_proof=[h.hex() for h in inclusion_proof],
        tree_head=tree_head,
        checkpoint=checkpoint,
    )


def parse_proof_document(doc: object) -> ProofDocument[AnyPublicReceipt]:
    """A proof document from decoded JSON, its receipt typed by its version. Raises
    msgspec.ValidationError naming what is malformed."""
    wire = msgspec.convert(doc, ProofDocument[dict[str, Any]])
    try:
        receipt = receipt_from_builtins(wire.receipt)
    except msgspec.ValidationError as exc:
        raise msgspec.ValidationError(f"in `$.receipt`: {exc}") from None
    # replace() keeps the struct's static type; only the receipt's type parameter changes.
    return cast(ProofDocument[AnyPublicReceipt], msgspec.structs.replace(wire, receipt=receipt))
