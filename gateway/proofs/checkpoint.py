"""The log's checkpoint as a C2SP signed note (c2sp.org/tlog-checkpoint, c2sp.org/signed-note).

    gw.example.com/log
    1234
    <base64 root hash>

    — gw.example.com/log <base64(4-byte key id || Ed25519 signature)>

The note is signed by the deployment's log key under the key name = the origin. Its key id
is SHA-256(name || 0x0A || 0x01 || public key)[:4], and monitors configure the key as a
verifier key `<name>+<8 hex key id>+<base64(0x01 || public key)>` (GET /api/proofs/keys).
Ed25519 is deterministic, so every process holding the key signs a head into the very same
bytes: a checkpoint need not be stored, only the signed tree head it restates.
"""

from __future__ import annotations

import base64
import hashlib
import re
from urllib.parse import urlsplit

from model_gateway.gateway.proofs.log_key import SigningKey, verify_signature

ED25519 = b"\x01"
DEFAULT_ORIGIN = "gateway.local/log"
_SIGNATURE_LINE = re.compile(r"\u2014 (\S+) ([A-Za-z0-9+/=]+)\n")


def default_origin(public_url: str | None) -> str:
    """`<public_url host>/log`, or gateway.local/log without a public_url."""
    if not public_url:
        return DEFAULT_ORIGIN
    parts = urlsplit(public_url)
    host = (parts.hostname or "").lower()
    if not host:
        return DEFAULT_ORIGIN
    return f"{host}:{parts.port}/log" if parts.port else f"{host}/log"


def note_key_id(name: str, public_key: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + ED25519 + public_key).digest()[:4]


def verifier_key(name: str, public_key: bytes) -> str:
    """The note verifier key (vkey) monitors configure: name+keyid+base64(0x01 || key)."""
    encoded = base64.b64encode(ED25519 + public_key).decode()
    return f"{name}+{note_key_id(name, public_key).hex()}+{encoded}"


def checkpoint_body(origin: str, size: int, root_hash: bytes) -> str:
    return f"{origin}\n{size}\n{base64.b64encode(root_hash).decode()}\n"


def sign_checkpoint(key: SigningKey, origin: str, size: int, root_hash: bytes) -> str:
    body = checkpoint_body(origin, size, root_hash)
    signature = note_key_id(origin, key.public_key) + key.sign(body.encode())
    return f"{body}\n\u2014 {origin} {base64.b64encode(signature).decode()}\n"


class Checkpoint:
    """A checkpoint whose signature by `public_key` verified."""

    def __init__(self, origin: str, size: int, root_hash: bytes) -> None:
        self.origin, self.size, self.root_hash = origin, size, root_hash


def open_checkpoint(note: str, public_key: bytes) -> Checkpoint | None:
    """The checkpoint in `note` if a signature by `public_key` under the origin's name
    verifies, else None (unsigned, signed by another key, altered, or malformed)."""
    body, sep, signatures = note.rpartition("\n\n")
    if not sep or not body:
        return None
    body += "\n"
    lines = body.split("\n")[:-1]
    if len(lines) < 3 or not all(lines) or not lines[1].isdigit() or lines[1] != str(int(lines[1])):
        return None
    origin, size = lines[0], int(lines[1])
    try:
        root_hash = base64.b64decode(lines[2], validate=True)
    except ValueError:
        return None
    if len(root_hash) != 32:
        return None
    wanted_id = note_key_id(origin, public_key)
    for found in _SIGNATURE_LINE.finditer(signatures):
        name, encoded = found.groups()
        try:
            signature = base64.b64decode(encoded, validate=True)
        except ValueError:
            continue
        if name != origin or signature[:4] != wanted_id:
            continue  # another key's signature: ignored, as the note spec says
        if verify_signature(public_key, signature[4:], body.encode()):
            return Checkpoint(origin, size, root_hash)
        return None  # our key's signature does not verify: reject the whole note
    return None
