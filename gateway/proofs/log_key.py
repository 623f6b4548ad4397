"""The deployment's Ed25519 signing key.

The key file (secrets.signing_key_file) holds the 32-byte private key (the RFC 8032 seed)
as hex and is created with mode 0600 on first start. A key is named by its key id: the
first 16 hex characters of SHA-256 over the 32-byte raw public key, so anyone holding the
public key can recompute the id.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from model_gateway.gateway.secretfile import load_or_create_secret

ALGORITHM = "ed25519"
SEED_SIZE = 32


def key_id(public_key: bytes) -> str:
    return hashlib.sha256(public_key).hexdigest()[:16]


class SigningKey:
    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private_key = private_key
        self.public_key = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = key_id(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self._private_key.sign(message)

    def public_record(self) -> dict[str, str]:
        """What GET /api/proofs/keys publishes for this key."""
        return {"key_id": self.key_id, "algorithm": ALGORITHM, "public_key": self.public_key.hex()}


def load_or_create_signing_key(path: Path) -> SigningKey:
    seed = load_or_create_secret(path, SEED_SIZE)
    if len(seed) != SEED_SIZE:
        raise ValueError(f"signing key file {path} must hold a 32-byte Ed25519 key in hex")
    return SigningKey(Ed25519PrivateKey.from_private_bytes(seed))


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):  # ValueError: not a 32-byte public key
        return False
    return True
