"""The checkpoint as a C2SP signed note, and the note verifier key, checked against the
specs' own examples and rules (c2sp.org/signed-note, c2sp.org/tlog-checkpoint)."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from model_gateway.gateway.config import ConfigError, parse_config
from model_gateway.gateway.proofs.checkpoint import (
    default_origin,
    note_key_id,
    open_checkpoint,
    sign_checkpoint,
    verifier_key,
)
from model_gateway.gateway.proofs.endpoints import log_origin
from model_gateway.gateway.proofs.log_key import SigningKey

KEY = SigningKey.generate()
ROOT = hashlib.sha256(b"root").digest()


def test_the_note_has_the_checkpoint_lines_a_blank_line_and_one_signature_line():
    note = sign_checkpoint(KEY, "example.com/log", 1234, ROOT)
    body, signatures = note.split("\n\n")
    assert body.split("\n") == ["example.com/log", "1234", base64.b64encode(ROOT).decode()]
    assert signatures.endswith("\n") and signatures.count("\n") == 1
    dash, name, encoded = signatures.rstrip("\n").split(" ")
    assert (dash, name) == ("\u2014", "example.com/log")
    raw = base64.b64decode(encoded)
    assert len(raw) == 4 + 64
    # key ID = SHA-256(key name || 0x0A || 0x01 || 32-byte Ed25519 public key)[:4]
    assert raw[:4] == hashlib.sha256(b"example.com/log\n\x01" + KEY.public_key).digest()[:4]
    # Checked with another Ed25519 implementation than the one that signed.
    Ed25519PublicKey.from_public_bytes(KEY.public_key).verify(raw[4:], (body + "\n").encode())
    checkpoint = open_checkpoint(note, KEY.public_key)
    assert (checkpoint.origin, checkpoint.size, checkpoint.root_hash) == (
        "example.com/log",
        1234,
        ROOT,
    )


def test_the_verifier_key_names_the_signer_as_monitors_configure_it():
    vkey = verifier_key("example.com/log", KEY.public_key)
    name, key_hash, encoded = vkey.split("+", 2)
    assert name == "example.com/log"
    assert key_hash == note_key_id(name, KEY.public_key).hex() and len(key_hash) == 8
    assert base64.b64decode(encoded) == b"\x01" + KEY.public_key


@pytest.mark.parametrize(
    "alter",
    [
        lambda n: n.replace("\n1234\n", "\n1235\n"),
        lambda n: n.replace("example.com/log\n", "example.com/other\n", 1),
        lambda n: n.replace("\n\n", "\nextension\n\n"),
        lambda n: n.split("\n\n")[0] + "\n\n",  # no signature at all
        lambda n: n.replace("\u2014 example.com/log", "\u2014 someone.else/log"),
        lambda n: n[:-6] + ("AAAA" if n[-6:-2] != "AAAA" else "BBBB") + n[-2:],
        lambda n: "garbage",
        lambda n: n.replace("\n1234\n", "\n01234\n"),
    ],
)
def test_an_altered_or_foreign_note_does_not_open(alter):
    note = sign_checkpoint(KEY, "example.com/log", 1234, ROOT)
    assert open_checkpoint(note, KEY.public_key) is not None
    assert open_checkpoint(alter(note), KEY.public_key) is None


def test_a_note_signed_by_another_key_does_not_open_and_other_signatures_are_ignored():
    other = SigningKey.generate()
    note = sign_checkpoint(other, "example.com/log", 7, ROOT)
    assert open_checkpoint(note, KEY.public_key) is None
    # A witness's cosignature line beside ours is ignored, ours still verifies.
    ours = sign_checkpoint(KEY, "example.com/log", 7, ROOT)
    witness_line = note.split("\n\n")[1]
    assert open_checkpoint(ours + witness_line, KEY.public_key) is not None
    assert open_checkpoint(ours.replace("\u2014", witness_line + "\u2014", 1), KEY.public_key)


@pytest.mark.parametrize(
    ("public_url", "origin"),
    [
        (None, "gateway.local/log"),
        ("https://GW.example.com", "gw.example.com/log"),
        ("https://gw.example.com/llm", "gw.example.com/log"),
        ("http://gw.example.com:8443/", "gw.example.com:8443/log"),
    ],
)
def test_the_default_origin_follows_public_url(public_url, origin):
    assert default_origin(public_url) == origin
    server = f'[server]\npublic_url = "{public_url}"\n' if public_url else ""
    assert log_origin(parse_config(server)) == origin


def test_the_origin_from_config_wins_and_must_be_a_note_key_name():
    config = parse_config(
        '[server]\npublic_url = "https://a.example"\n[proofs]\norigin = "b.example/x"\n'
    )
    assert log_origin(config) == "b.example/x"
    for bad in ("has space", "a+b", ""):
        with pytest.raises(ConfigError, match=r"proofs\.origin"):
            parse_config(f'[proofs]\norigin = "{bad}"\n')
    with pytest.raises(ConfigError, match=r"proofs\.other"):
        parse_config('[proofs]\nother = "x"\n')
