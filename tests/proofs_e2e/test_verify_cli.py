"""`gateway verify FILE`: a real server's proof saved to a file, then altered field by field.
Every alteration must fail with exit 1 and a reason; an untouched document passes."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import operator
import os
import subprocess

import msgspec
import pytest

from model_gateway.gateway.proofs.log_key import SigningKey
from model_gateway.gateway.proofs.merkle import MerkleTree
from model_gateway.gateway.proofs.receipts import (
    proof_document,
    receipt_from_builtins,
    receipt_leaf_hash,
    sign_receipt,
    sign_tree_head,
)
from model_gateway.gateway.proofs.verify_cli import keys_url_for
from tests.proofs_e2e.conftest import chat, verify, wait_proof
from tests.support.gateway_process import GATEWAY


@pytest.fixture(scope="module")
def proof(http, customer) -> dict:
    """A proof whose inclusion path has at least one hash (the tree holds a later leaf)."""
    first = chat(http, customer.key)
    wait_proof(http, chat(http, customer.key))
    doc = wait_proof(http, first)
    assert doc["inclusion_proof"], "a tree of one leaf has an empty path"
    return doc


@pytest.fixture(scope="module")
def public_key(http) -> str:
    return http.get("/api/proofs/keys").json()["data"][0]["public_key"]


def save(tmp_path, doc: dict, name: str = "proof.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def flip(text: str) -> str:
    return text[:-1] + format(int(text[-1], 16) ^ 1, "x")


def flip_signature_byte(note: str) -> str:
    """The signed note with one bit of its signature's last byte flipped (a base64
    character next to the padding may carry only padding bits: changing it changes nothing)."""
    head, line = note.rstrip("\n").rsplit("\n", 1)
    prefix, encoded = line.rsplit(" ", 1)
    raw = bytearray(base64.b64decode(encoded))
    raw[-1] ^= 1  # past the 4-byte key hash: the Ed25519 signature itself
    return f"{head}\n{prefix} {base64.b64encode(bytes(raw)).decode()}\n"


TAMPERS = {
    "cost": (("receipt", "cost"), lambda v: "0.000000"),
    "status": (("receipt", "status"), lambda v: "failed" if v == "succeeded" else "succeeded"),
    "time": (("receipt", "issued_at"), lambda v: "2020-01-01T00:00:00.000000Z"),
    "id": (("receipt", "id"), lambda v: "rcpt_someoneelse"),
    "usage": (("receipt", "usage"), lambda v: {k: n + 1 for k, n in v.items()}),
    "model": (("receipt", "model_or_runtime"), lambda v: "gpt-cheap"),
    "request commitment": (("receipt", "request_commitment"), flip),
    "response commitment": (("receipt", "response_commitment"), flip),
    "usage source": (
        ("receipt", "usage_source"),
        lambda v: "gateway" if v == "provider" else "provider",
    ),
    "version": (("receipt", "v"), lambda v: 1),
    "a hash in the path": (("inclusion_proof", 0), flip),
    "leaf index": (("leaf_index",), lambda v: v + 1),
    # New leaves carry no signature of their own: one slipped in must still be checked.
    "receipt signature added": (("receipt_signature",), lambda v: "00" * 64),
    "checkpoint size": (("checkpoint",), lambda v: v.replace(f"\n{v.split()[1]}\n", "\n1\n", 1)),
    "checkpoint signature": (("checkpoint",), lambda v: flip_signature_byte(v)),
    "tree head root": (("tree_head", "root_hash"), flip),
    "tree head size": (("tree_head", "size"), lambda v: v + 1),
    "tree head time": (("tree_head", "timestamp"), lambda v: "2020-01-01T00:00:00.000000Z"),
    "tree head signature": (("tree_head", "signature"), flip),
    "public key": (("public_key",), flip),
}


def tampered(doc: dict, path: tuple, change) -> dict:
    doc = copy.deepcopy(doc)
    parent = doc
    for step in path[:-1]:
        parent = operator.getitem(parent, step)
    last = path[-1]
    parent[last] = change(parent[last] if isinstance(parent, list) else parent.get(last))
    return doc


def test_the_untouched_file_verifies_against_the_deployment_key(tmp_path, proof, public_key):
    code, report, output = verify(save(tmp_path, proof), "--key", public_key, "--json")
    assert code == 0, output
    assert report["ok"] and report["key_trusted"] and report["key_source"] == "argument"
    assert report["receipt_id"] == proof["receipt"]["id"]


@pytest.mark.parametrize("what", sorted(TAMPERS))
def test_an_altered_file_fails(tmp_path, proof, public_key, what):
    path, change = TAMPERS[what]
    doc = tampered(proof, path, change)
    code, report, output = verify(save(tmp_path, doc), "--key", public_key, "--json")
    assert code == 1, output
    assert report["ok"] is False
    assert report["reasons"], "a failure names its reasons"


def test_the_text_output_lists_the_reasons(tmp_path, proof, public_key):
    doc = tampered(proof, ("receipt", "cost"), lambda v: "0.000000")
    doc = tampered(doc, ("tree_head", "signature"), flip)
    code, _, output = verify(save(tmp_path, doc), "--key", public_key)
    assert code == 1
    assert output.startswith("FAILED")
    assert "the tree head signature is invalid" in output
    assert "the inclusion proof does not lead" in output


def test_a_new_proof_is_proven_by_its_signed_head_and_checkpoint_alone(proof):
    assert "receipt_signature" not in proof
    assert proof["checkpoint"].startswith("gateway.local/log\n" + str(proof["tree_head"]["size"]))


def verify_in(folder, *args: str, **env: str) -> tuple[int, dict | None, str]:
    """`gateway verify ARGS` run in `folder`, where no config is unless the test put one
    (the deployment's own key is looked for through GATEWAY_CONFIG and ./config.toml)."""
    environment = {k: v for k, v in os.environ.items() if k != "GATEWAY_CONFIG"}
    done = subprocess.run(
        [GATEWAY, "verify", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=folder,
        env={**environment, **env},
    )
    parsed = json.loads(done.stdout) if "--json" in args and done.stdout.strip() else None
    return done.returncode, parsed, done.stdout + done.stderr


def test_a_file_without_a_trusted_key_is_valid_but_exits_3(tmp_path, proof):
    """Only the key the document names: consistent, and proving nothing about who made it."""
    code, report, output = verify_in(tmp_path, save(tmp_path, proof), "--json")
    assert code == 3, output
    assert report["ok"] is True
    assert report["key_trusted"] is False
    assert report["key_source"] == "document"
    code, _, text = verify_in(tmp_path, save(tmp_path, proof))
    assert code == 3
    assert text.startswith("signature valid, key not trusted: receipt ")
    assert "NOT trusted" in text


def test_a_url_without_a_trusted_key_is_valid_but_exits_3(gateway, tmp_path, proof):
    """The key the same server publishes is trust on first use, not trust."""
    url = f"{gateway.url}/api/proofs/{proof['receipt']['id']}"
    code, report, output = verify_in(tmp_path, url, "--json")
    assert code == 3, output
    assert (report["ok"], report["key_trusted"], report["key_source"]) == (True, False, "server")
    code, _, text = verify_in(tmp_path, url)
    assert code == 3 and text.startswith("signature valid, key not trusted")


def test_the_deployments_own_key_is_found_through_its_config(gateway, tmp_path, proof):
    """--config, GATEWAY_CONFIG or ./config.toml: the operator checks their own receipts
    against the key file itself, and a document signed by any other key fails."""
    path = save(tmp_path, proof)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = str(gateway.config_path)
    for folder, args, env in (
        (elsewhere, ["--config", config], {}),
        (elsewhere, [], {"GATEWAY_CONFIG": config}),
        (gateway.folder, [], {}),
    ):
        code, report, output = verify_in(folder, path, *args, "--json", **env)
        assert code == 0, (args, env, output)
        assert (report["ok"], report["key_trusted"], report["key_source"]) == (True, True, "config")
        assert str(gateway.folder / "data" / "signing-key") in report["key_source_detail"]
    code, report, output = verify_in(elsewhere, save(tmp_path, forged(proof), "forged.json"),
                                     "--config", config, "--json")  # fmt: skip
    assert code == 1, output
    assert "the document is signed by a key other than the trusted one" in report["reasons"]


def test_host_and_port_without_a_scheme_is_a_url(gateway, tmp_path, proof, public_key):
    bare = gateway.url.removeprefix("http://")  # 127.0.0.1:PORT
    for page in ("api/proofs", "proofs"):
        target = f"{bare}/{page}/{proof['receipt']['id']}"
        code, report, output = verify_in(tmp_path, target, "--key", public_key, "--json")
        assert code == 0, output
        assert report["receipt_id"] == proof["receipt"]["id"]


def forged(doc: dict) -> dict:
    """The receipt with a lower cost, re-signed and re-logged by someone else's key: a
    document that is internally consistent and proves nothing about the deployment."""
    key = SigningKey.generate()
    receipt = receipt_from_builtins({**doc["receipt"], "cost": "0.000001"})
    tree = MerkleTree([receipt_leaf_hash(receipt)])
    head = sign_tree_head(key, 1, tree.root(), doc["tree_head"]["timestamp"])
    fake = proof_document(
        receipt=receipt,
        receipt_signature=sign_receipt(key, receipt),
        public_key=key.public_key,
        leaf_index=0,
        inclusion_proof=[],
        tree_head=head,
    )
    return msgspec.json.decode(msgspec.json.encode(fake))


def test_a_document_signed_by_another_key_fails_against_the_deployment(
    gateway, tmp_path, proof, public_key
):
    path = save(tmp_path, forged(proof))
    # Alone it only shows self-consistency, and says so.
    code, report, _ = verify_in(tmp_path, path, "--json")
    assert (code, report["ok"], report["key_trusted"]) == (3, True, False)
    for trust in (["--key", public_key], ["--keys-url", f"{gateway.url}/api/proofs/keys"]):
        code, report, output = verify(path, *trust, "--json")
        assert code == 1, output
        assert report["key_trusted"] is (trust[0] == "--key")  # a fetched key is not trusted
        assert "the document is signed by a key other than the trusted one" in report["reasons"]


def test_unreadable_input_and_bad_keys_cannot_be_checked(tmp_path, proof):
    code, report, _ = verify(str(tmp_path / "missing.json"), "--json")
    assert (code, report["checked"]) == (2, False)
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert verify(str(tmp_path / "bad.json"))[0] == 2
    code, report, _ = verify(save(tmp_path, proof), "--key", "abcd", "--json")
    assert (code, report["ok"]) == (2, False)
    # A document that is not a proof at all is invalid, not unreadable.
    code, report, _ = verify(save(tmp_path, {"hello": "world"}), "--json")
    assert code == 1 and "malformed proof document" in report["reasons"][0]


def test_verify_needs_no_config_file(tmp_path, proof, public_key, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no config.toml here
    code, _, output = verify(save(tmp_path, proof), "--key", public_key)
    assert code == 0, output


@pytest.mark.parametrize(
    ("url", "keys"),
    [
        ("https://gw.example/api/proofs/rcpt_1", "https://gw.example/api/proofs/keys"),
        ("https://gw.example/proofs/rcpt_1", "https://gw.example/api/proofs/keys"),
        (
            "https://gw.example:8443/gw/api/proofs/rcpt_1?x=1",
            "https://gw.example:8443/gw/api/proofs/keys",
        ),
        ("http://127.0.0.1:8080/other.json", "http://127.0.0.1:8080/api/proofs/keys"),
    ],
)
def test_keys_are_fetched_from_the_same_origin(url, keys):
    assert keys_url_for(url) == keys


def test_the_commitment_fields_are_sha256_hex(proof):
    # What the page tells a customer to open with their salts and bodies.
    assert proof["receipt"]["v"] == 3
    for field in ("request_commitment", "response_commitment"):
        assert len(bytes.fromhex(proof["receipt"][field])) == hashlib.sha256().digest_size
    assert "request_sha256" not in proof["receipt"]
    assert "response_sha256" not in proof["receipt"]


def test_a_pending_answer_saved_to_a_file_is_reported_as_pending(tmp_path):
    pending = {"status": "pending", "receipt_id": "rcpt_1", "retry_after_seconds": 1}
    code, report, _ = verify(save(tmp_path, pending), "--json")
    assert code == 2
    assert "pending" in report["reasons"][0]
