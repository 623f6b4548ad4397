"""Project API keys: `proj_live_` + 32 base62 characters; only prefix and HMAC are ever stored."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string

KEY_PREFIX = "proj_live_"
RANDOM_LENGTH = 32
PUBLIC_PREFIX_LENGTH = len(KEY_PREFIX) + 8
SCOPES = frozenset({"inference", "sandboxes", "receipts", "agents"})

_BASE62 = string.ascii_letters + string.digits
_KEY_RE = re.compile(rf"{KEY_PREFIX}[A-Za-z0-9]{{{RANDOM_LENGTH}}}")


def generate_key() -> str:
    return KEY_PREFIX + "".join(secrets.choice(_BASE62) for _ in range(RANDOM_LENGTH))


def is_well_formed(key: str) -> bool:
    return _KEY_RE.fullmatch(key) is not None


def public_prefix(key: str) -> str:
    return key[:PUBLIC_PREFIX_LENGTH]


def hash_key(pepper: bytes, key: str) -> bytes:
    return hmac.new(pepper, key.encode(), hashlib.sha256).digest()


def matches(pepper: bytes, key: str, stored_hash: bytes) -> bool:
    return hmac.compare_digest(hash_key(pepper, key), stored_hash)


def parse_scopes(text: str) -> frozenset[str]:
    scopes = frozenset(s.strip() for s in text.split(",") if s.strip())
    if not scopes:
        raise ValueError("a key needs at least one scope")
    unknown = scopes - SCOPES
    if unknown:
        raise ValueError(f"unknown scope(s): {', '.join(sorted(unknown))}")
    return scopes
