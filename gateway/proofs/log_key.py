"""The deployment's Ed25519 signing key.

The key file (secrets.signing_key_file) holds the 32-byte private key (the RFC 8032 seed)
as hex and is created with mode 0600 on first start. A key is named by its key id: the
first 16 hex characters of SHA-256 over the 32-byte raw public key, so anyone holding the
public key can recompute the id.

Ed25519 through PyNaCl (libsodium): the same deterministic signatures (RFC 8032) as any
other implementation, for 1.2 MiB of resident memory where `cryptography`'s Rust library
took 9.6 MiB of the server's idle footprint. The tests check our signatures with
`cryptography` as an independent implementation.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import nacl.exceptions
import nacl.signing

from model_gateway.gateway.ops.secretfile import load_or_create_secret

ALGORITHM = "ed25519"
SEED_SIZE = 32


def key_id(public_key: bytes) -> str:
    return hashlib.sha256(public_key).hexdigest()[:16]


class SigningKey:
    def __init__(self, seed: bytes) -> None:
        """The key of a 32-byte RFC 8032 seed (what the key file holds)."""
        if len(seed) != SEED_SIZE:
            raise ValueError("an Ed25519 seed is 32 bytes")
        self._private_key = nacl.signing.SigningKey(seed)
        self.public_key = bytes(self._private_key.verify_key)
        self.key_id = key_id(self.public_key)

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(os.urandom(SEED_SIZE))

    def sign(self, message: bytes) -> bytes:
        return self._private_key.sign(message).signature

    def public_record(self) -> dict[str, str]:
        """What GET /api/proofs/keys publishes for this key."""
        return {"key_id": self.key_id, "algorithm": ALGORITHM, "public_key": self.public_key.hex()}


def load_or_create_signing_key(path: Path) -> SigningKey:
    seed = load_or_create_secret(path, SEED_SIZE)
    if len(seed) != SEED_SIZE:
        raise ValueError(f"signing key file {path} must hold a 32-byte Ed25519 key in hex")
    return SigningKey(seed)


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        nacl.signing.VerifyKey(public_key).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
        return False  # ValueError, TypeError: not a 32-byte key or a 64-byte signature
    return True
