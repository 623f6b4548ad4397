import hashlib
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from model_gateway.gateway.proofs.log_key import (
    SigningKey,
    key_id,
    load_or_create_signing_key,
    verify_signature,
)


def test_key_file_is_created_0600_and_reloads_the_same_key(tmp_path):
    path = tmp_path / "nested" / "dir" / "signing-key"
    key = load_or_create_signing_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_signing_key(path)
    assert again.public_key == key.public_key
    assert again.key_id == key.key_id
    assert verify_signature(key.public_key, again.sign(b"message"), b"message")


def test_a_file_of_the_wrong_size_is_refused(tmp_path):
    path = tmp_path / "signing-key"
    path.write_text("00" * 16)
    with pytest.raises(ValueError, match="32-byte"):
        load_or_create_signing_key(path)


def test_key_id_is_the_first_16_hex_of_sha256_of_the_raw_public_key():
    key = SigningKey.generate()
    assert len(key.public_key) == 32
    assert key.key_id == hashlib.sha256(key.public_key).hexdigest()[:16] == key_id(key.public_key)
    assert key.public_record() == {
        "key_id": key.key_id,
        "algorithm": "ed25519",
        "public_key": key.public_key.hex(),
    }


def test_signatures_fail_for_another_message_key_or_signature():
    key, other = SigningKey.generate(), SigningKey.generate()
    signature = key.sign(b"message")
    assert verify_signature(key.public_key, signature, b"message")
    assert not verify_signature(key.public_key, signature, b"messagE")
    assert not verify_signature(other.public_key, signature, b"message")
    assert not verify_signature(key.public_key, bytes(64), b"message")
    assert not verify_signature(key.public_key[:31], signature, b"message")


def test_rfc_8032_test_vector_1():
    public_key = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
    signature = bytes.fromhex(
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e3970"
        "1cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )
    assert verify_signature(public_key, signature, b"")
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    assert SigningKey(seed).public_key == public_key


def test_signatures_match_an_independent_implementation():
    """Ed25519 is deterministic (RFC 8032): `cryptography` (OpenSSL) signs the same bytes
    for the same seed, and each implementation verifies the other's signatures."""
    seed = bytes(range(32))
    ours, theirs = SigningKey(seed), Ed25519PrivateKey.from_private_bytes(seed)
    message = b"model-gateway tree head v1\n{}"
    assert ours.sign(message) == theirs.sign(message)
    theirs.public_key().verify(ours.sign(message), message)  # raises if it does not verify
    assert verify_signature(ours.public_key, theirs.sign(message), message)


def test_a_signature_or_seed_of_the_wrong_size_is_refused():
    key = SigningKey.generate()
    assert not verify_signature(key.public_key, key.sign(b"m")[:63], b"m")
    with pytest.raises(ValueError, match="32 bytes"):
        SigningKey(bytes(31))
