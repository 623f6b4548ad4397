import copy
import functools
import hashlib
import http.server
import operator
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_gateway.gateway.metering.money import format_amount
from model_gateway.gateway.proofs.commitments import request_commitment, response_commitment
from model_gateway.gateway.proofs.log_key import SigningKey
from model_gateway.gateway.proofs.merkle import MerkleTree
from model_gateway.gateway.proofs.receipts import (
    PublicReceipt,
    PublicReceiptV1,
    canonical_bytes,
    format_timestamp,
    proof_document,
    receipt_leaf_hash,
    sign_receipt,
    sign_tree_head,
)
from model_gateway.gateway.proofs.verify import DocumentError, load_document, verify_proof_document

KEY = SigningKey.generate()
T0 = 1_735_689_600_000_000  # 2025-01-01T00:00:00Z in unix microseconds


def make_receipt_v1(n: int) -> PublicReceiptV1:
    return PublicReceiptV1(
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


def make_receipt(n: int) -> PublicReceipt:
    salt = b"salt %011d" % n  # 16 bytes
    return PublicReceipt(
        id=f"rcpt_{n:016x}",
        issued_at=format_timestamp(T0 + n),
        kind="inference",
        endpoint="/v1/chat/completions",
        model_or_runtime="test-model",
        status="succeeded",
        usage={"input_tokens": 12 + n, "output_tokens": 30},
        usage_source="provider",
        cost=format_amount(120 + n),
        request_commitment=request_commitment(salt, b"request %d" % n),
        response_commitment=response_commitment(
            salt, hashlib.sha256(b"response %d" % n).hexdigest()
        ),
    )


def issue(batches=(5, 6), key=KEY, v1_batches=1) -> list[dict]:
    """Receipts issued in batches, a tree head after each; documents against the last.
    The first `v1_batches` batches hold version 1 receipts, the rest version 2: a log
    upgraded between two batches, as a deployment's log is."""
    receipts, tree, head = [], MerkleTree(), None
    for number, batch in enumerate(batches):
        make = make_receipt_v1 if number < v1_batches else make_receipt
        new = [make(len(receipts) + i) for i in range(batch)]
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
DOC = DOCS[6]  # version 2
DOC_V1 = DOCS[2]


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
    "receipt.status.cancelled": (["receipt", "status"], "cancelled", RECEIPT),
    "receipt.usage": (["receipt", "usage", "output_tokens"], 3, RECEIPT),
    "receipt.usage_source": (["receipt", "usage_source"], "gateway", RECEIPT),
    "receipt.cost": (["receipt", "cost"], "0.000127", RECEIPT),
    "receipt.request_commitment": (["receipt", "request_commitment"], flip_hex, RECEIPT),
    "receipt.response_commitment": (["receipt", "response_commitment"], flip_hex, RECEIPT),
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
# A version 1 receipt's own fields, and the ones it shares, in a log that also holds v2.
TAMPERS_V1 = {
    "receipt.request_sha256": (["receipt", "request_sha256"], flip_hex, RECEIPT),
    "receipt.response_sha256": (["receipt", "response_sha256"], flip_hex, RECEIPT),
    "receipt.cost": TAMPERS["receipt.cost"],
    "receipt.usage": TAMPERS["receipt.usage"],
    "leaf_index": (["leaf_index"], 3, ["inclusion proof"]),
}


def tampered(path: list, change, original: dict = DOC) -> dict:
    doc = copy.deepcopy(original)
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


@pytest.mark.parametrize(("path", "change", "expected"), TAMPERS_V1.values(), ids=TAMPERS_V1.keys())
def test_changing_any_field_of_a_version_1_receipt_fails_verification(path, change, expected):
    assert "v" not in DOC_V1["receipt"]
    result = verify_proof_document(tampered(path, change, DOC_V1))
    assert not result.ok
    for fragment in expected:
        assert any(fragment in reason for reason in result.reasons), result.reasons


def test_swapping_in_another_valid_key_fails():
    other = SigningKey.generate()
    doc = copy.deepcopy(DOC) | {"public_key": other.public_key.hex()}
    result = verify_proof_document(doc)
    assert not result.ok
    assert len(result.reasons) == 3  # key id, receipt signature, tree head signature


def test_a_forged_log_is_only_caught_with_the_trusted_key():
    forger = SigningKey.generate()
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
    receipt = make_receipt_v1(0)
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


def test_a_version_2_receipt_commits_to_the_bodies_and_names_its_version():
    receipt = make_receipt(0)
    text = canonical_bytes(receipt)
    assert text.endswith(b',"usage_source":"provider","v":2}')
    # Neither plain digest is published: a short body could be guessed from it.
    for body in (b"request 0", b"response 0"):
        assert hashlib.sha256(body).hexdigest().encode() not in text
    salt = b"salt %011d" % 0
    assert receipt.request_commitment == hashlib.sha256(salt + b"request 0").hexdigest()
    inner = hashlib.sha256(b"response 0").digest()
    assert receipt.response_commitment == hashlib.sha256(salt + inner).hexdigest()


VERSION_TRICKS = {
    "v2 without v": lambda r: r.pop("v"),
    "v 1": lambda r: r.update(v=1),
    "v 3": lambda r: r.update(v=3),
    "v string": lambda r: r.update(v="2"),
    "v float": lambda r: r.update(v=2.0),
    "v true": lambda r: r.update(v=True),
    "v2 with a plain digest": lambda r: r.update(request_sha256="0" * 64),
    "v2 without usage_source": lambda r: r.pop("usage_source"),
    "usage_source other": lambda r: r.update(usage_source="upstream"),
}


@pytest.mark.parametrize("change", VERSION_TRICKS.values(), ids=VERSION_TRICKS.keys())
def test_a_receipt_is_read_as_the_version_it_names_and_nothing_else(change):
    doc = copy.deepcopy(DOC)
    change(doc["receipt"])
    result = verify_proof_document(doc)
    assert not result.ok
    assert result.reasons[0].startswith("malformed proof document"), result.reasons


def test_a_version_1_receipt_claiming_version_2_is_malformed():
    doc = copy.deepcopy(DOC_V1)
    doc["receipt"]["v"] = 2
    assert verify_proof_document(doc).reasons[0].startswith("malformed proof document")


def test_a_version_2_receipt_rewritten_as_version_1_fails():
    """A downgrade: the v2 leaf's fields rewritten in v1 form (plain digests) is well
    formed, and signed by nobody."""
    doc = copy.deepcopy(DOC)
    receipt = doc["receipt"]
    for name in ("v", "usage_source", "request_commitment", "response_commitment"):
        receipt.pop(name)
    receipt["request_sha256"] = hashlib.sha256(b"request 6").hexdigest()
    receipt["response_sha256"] = hashlib.sha256(b"response 6").hexdigest()
    result = verify_proof_document(doc, KEY.public_key)
    assert set(result.reasons) == {
        "the receipt signature is invalid",
        "the inclusion proof does not lead from the receipt to the tree head root",
    }


FIXTURES = Path(__file__).parent / "fixtures" / "v1"


def fixture_key() -> bytes:
    seed = bytes.fromhex((FIXTURES / "signing-key").read_text().strip())
    return SigningKey(seed).public_key


def test_a_proof_made_by_the_version_1_code_still_verifies():
    doc = orjson.loads((FIXTURES / "v1_proof.json").read_bytes())
    assert "v" not in doc["receipt"] and "request_sha256" in doc["receipt"]
    result = verify_proof_document(doc, fixture_key())
    assert result.ok, result.reasons
    assert result.key_trusted
    altered = copy.deepcopy(doc)
    altered["receipt"]["request_sha256"] = flip_hex(altered["receipt"]["request_sha256"])
    assert not verify_proof_document(altered, fixture_key()).ok


@given(st.integers(min_value=-(10**15), max_value=253402300799999999))
def test_timestamps_match_the_calendar_to_the_microsecond(unix_micros):
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=unix_micros)
    assert format_timestamp(unix_micros) == moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
