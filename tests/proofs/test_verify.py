import copy
import functools
import hashlib
import http.server
import operator
import threading

import msgspec
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.money import format_amount
from gateway.proofs.merkle import MerkleTree
from gateway.proofs.receipts import (
    PublicReceipt,
    canonical_bytes,
    format_timestamp,
    proof_document,
    receipt_leaf_hash,
    sign_receipt,
    sign_tree_head,
)
from gateway.proofs.signing import SigningKey
from gateway.proofs.verify import DocumentError, load_document, verify_proof_document

KEY = SigningKey(Ed25519PrivateKey.generate())
T0 = 1_735_689_600_000_000  # 2025-01-01T00:00:00Z in unix microseconds


def make_receipt(n: int) -> PublicReceipt:
    return PublicReceipt(
        id=f"rcpt_{n:016x}",
        issued_at=format_timestamp(T0 + n),
        kind="inference",
        endpoint="/v1/chat/completions",
        model_or_runtime="test-model",
        status="succeeded",
        usage={"input_tokens": 12 + n, "output_tokens": 30},
        cost=format_amount(120 + n),
        request_sha256=hashlib.sha256(b"request %d" % n).hexdigest(),
        response_sha256=hashlib.sha256(b"response %d" % n).hexdigest(),
    )


def issue(batches=(5, 6), key=KEY) -> list[dict]:
    """Receipts issued in batches, a tree head after each; documents against the last."""
    receipts, tree, head = [], MerkleTree(), None
    for batch in batches:
        new = [make_receipt(len(receipts) + i) for i in range(batch)]
        receipts += new
        tree.extend(receipt_leaf_hash(r) for r in new)
        head = sign_tree_head(key, tree.size, tree.root(), format_timestamp(T0 + tree.size))
    docs = [
        proof_document(
            receipt=r,
            receipt_signature=sign_receipt(key, r),
            public_key=key.public_key,
            leaf_index=i,
            inclusion_proof=tree.inclusion_proof(i),
            tree_head=head,
        )
        for i, r in enumerate(receipts)
    ]
    return [orjson.loads(msgspec.json.encode(d)) for d in docs]  # as they travel: JSON


DOCS = issue()
DOC = DOCS[6]


def flip_hex(text: str) -> str:
    return text[:-1] + format(int(text[-1], 16) ^ 1, "x")


RECEIPT = ["receipt signature", "inclusion proof"]
TAMPERS = {
    "receipt.id": (["receipt", "id"], "rcpt_0000000000000099", RECEIPT),
    "receipt.issued_at": (["receipt", "issued_at"], "2025-01-01T00:00:00.000007Z", RECEIPT),
    "receipt.kind": (["receipt", "kind"], "sandbox", RECEIPT),
    "receipt.endpoint": (["receipt", "endpoint"], "/v1/responses", RECEIPT),
    "receipt.model_or_runtime": (["receipt", "model_or_runtime"], "other-model", RECEIPT),
    "receipt.status": (["receipt", "status"], "failed", RECEIPT),
    "receipt.usage": (["receipt", "usage", "output_tokens"], 3, RECEIPT),
    "receipt.cost": (["receipt", "cost"], "0.000127", RECEIPT),
    "receipt.request_sha256": (["receipt", "request_sha256"], flip_hex, RECEIPT),
    "receipt.response_sha256": (["receipt", "response_sha256"], flip_hex, RECEIPT),
    "receipt_signature": (["receipt_signature"], flip_hex, ["receipt signature"]),
    "key_id": (["key_id"], "0123456789abcdef", ["key_id does not match", "different key_id"]),
    "leaf_index": (["leaf_index"], 5, ["inclusion proof"]),
    "tree_head.size": (["tree_head", "size"], 12, ["tree head signature"]),
    "tree_head.root_hash": (["tree_head", "root_hash"], flip_hex, ["tree head signature"]),
    "tree_head.timestamp": (
        ["tree_head", "timestamp"],
        "2025-01-01T00:00:01.000000Z",
        ["tree head signature"],
    ),
    "tree_head.key_id": (["tree_head", "key_id"], "0123456789abcdef", ["different key_id"]),
    "tree_head.signature": (["tree_head", "signature"], flip_hex, ["tree head signature"]),
    **{
        f"inclusion_proof.{i}": (["inclusion_proof", i], flip_hex, ["inclusion proof"])
        for i in range(len(DOC["inclusion_proof"]))
    },
    "inclusion_proof.dropped": (["inclusion_proof"], lambda p: p[:-1], ["inclusion proof"]),
    "inclusion_proof.added": (["inclusion_proof"], lambda p: [*p, p[0]], ["inclusion proof"]),
}


def tampered(path: list, change) -> dict:
    doc = copy.deepcopy(DOC)
    *parents, last = path
    target = functools.reduce(operator.getitem, parents, doc)
    before = target[last]
    target[last] = change(before) if callable(change) else change
    assert target[last] != before, "a tamper must change something"
    return doc


def test_every_document_of_the_log_verifies():
    for doc in DOCS:
        result = verify_proof_document(doc, trusted_public_key=KEY.public_key)
        assert result.reasons == []
        assert result.ok and result.key_trusted
        assert (result.tree_size, result.key_id) == (11, KEY.key_id)


@pytest.mark.parametrize(("path", "change", "expected"), TAMPERS.values(), ids=TAMPERS.keys())
def test_changing_any_field_fails_verification(path, change, expected):
    result = verify_proof_document(tampered(path, change))
    assert not result.ok
    for fragment in expected:
        assert any(fragment in reason for reason in result.reasons), result.reasons


def test_swapping_in_another_valid_key_fails():
    other = SigningKey(Ed25519PrivateKey.generate())
    doc = copy.deepcopy(DOC) | {"public_key": other.public_key.hex()}
    result = verify_proof_document(doc)
    assert not result.ok
    assert len(result.reasons) == 3  # key id, receipt signature, tree head signature


def test_a_forged_log_is_only_caught_with_the_trusted_key():
    forger = SigningKey(Ed25519PrivateKey.generate())
    forged = issue(key=forger)[0]
    assert verify_proof_document(forged).ok  # consistent, but proves nothing about us
    result = verify_proof_document(forged, trusted_public_key=KEY.public_key)
    assert result.reasons == ["the document is signed by a key other than the trusted one"]


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.pop("tree_head"),
        lambda d: d["receipt"].update(extra="unsigned field"),
        lambda d: d["receipt"].update(cost="0.00012"),
        lambda d: d["receipt"].update(cost="0.000120\n"),
        lambda d: d["receipt"].update(status="pending"),
        lambda d: d["inclusion_proof"].__setitem__(0, d["inclusion_proof"][0].upper()),
        lambda d: d.update(leaf_index=-1),
        lambda d: d["tree_head"].update(size="11"),
    ],
    ids=[
        "missing",
        "extra receipt field",
        "5 decimals",
        "newline",
        "status",
        "uppercase hex",
        "negative index",
        "string size",
    ],
)
def test_malformed_documents_fail_with_a_reason(change):
    doc = copy.deepcopy(DOC)
    change(doc)
    result = verify_proof_document(doc)
    assert not result.ok
    assert result.reasons[0].startswith("malformed proof document")


def test_not_an_object_is_malformed():
    assert not verify_proof_document([DOC]).ok


def test_canonical_bytes_are_sorted_compact_json():
    receipt = make_receipt(0)
    assert canonical_bytes(receipt) == (
        b'{"cost":"0.000120","endpoint":"/v1/chat/completions","id":"rcpt_0000000000000000",'
        b'"issued_at":"2025-01-01T00:00:00.000000Z","kind":"inference",'
        b'"model_or_runtime":"test-model","request_sha256":"'
        + hashlib.sha256(b"request 0").hexdigest().encode()
        + b'","response_sha256":"'
        + hashlib.sha256(b"response 0").hexdigest().encode()
        + b'","status":"succeeded","usage":{"input_tokens":12,"output_tokens":30}}'
    )


def test_timestamps_keep_every_microsecond():
    assert format_timestamp(0) == "1970-01-01T00:00:00.000000Z"
    assert format_timestamp(T0 + 120) == "2025-01-01T00:00:00.000120Z"


def test_load_document_from_a_file(tmp_path):
    path = tmp_path / "proof.json"
    path.write_bytes(orjson.dumps(DOC))
    assert load_document(str(path)) == DOC


@pytest.mark.parametrize("content", [b"not json", b"[1, 2]"])
def test_load_document_refuses_what_is_not_a_json_object(tmp_path, content):
    path = tmp_path / "proof.json"
    path.write_bytes(content)
    with pytest.raises(DocumentError):
        load_document(str(path))


def test_load_document_of_a_missing_file(tmp_path):
    with pytest.raises(DocumentError):
        load_document(str(tmp_path / "absent.json"))


@pytest.fixture
def server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            found = self.path == "/api/proofs/rcpt_0000000000000006"
            json = self.headers["accept"] == "application/json"
            self.send_response(200 if found and json else 404)
            self.end_headers()
            self.wfile.write(orjson.dumps(DOC) if found else b"{}")

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_load_document_from_a_url(server):
    assert load_document(f"{server}/api/proofs/rcpt_0000000000000006") == DOC


def test_load_document_of_a_url_that_answers_404(server):
    with pytest.raises(DocumentError, match="404"):
        load_document(f"{server}/api/proofs/rcpt_missing")
