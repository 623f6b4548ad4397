"""Public receipts version 3 (decisions.md, "Prices, exactly"): a real `gateway serve`
logs an inference receipt priced by token class with its usage by class and the prices
applied, `"v": 3`; `gateway verify` (the real CLI) accepts its proof, fails it altered,
refuses a leaf no version describes, and verifies a log that holds v1, v2 and v3 leaves.
"""

from __future__ import annotations

import copy
import json

import httpx
import msgspec
import orjson
import pytest

from model_gateway.gateway.proofs.log_key import SigningKey
from model_gateway.gateway.proofs.merkle import MerkleTree
from model_gateway.gateway.proofs.receipts import (
    PublicReceiptV3,
    format_timestamp,
    proof_document,
    receipt_from_builtins,
    receipt_leaf_hash,
    sign_receipt,
    sign_tree_head,
)
from tests.proofs.test_verify import T0, make_receipt, make_receipt_v1
from tests.proofs_e2e.conftest import verify, wait_proof
from tests.support.fake_openai import CACHED_READS, REASONING, FakeOpenAI
from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import OPENAI_CREDENTIAL

MODEL = "priced/cached"  # the fake's `cached` mode: cache reads and reasoning
PRICES = {  # USD per million tokens, a different one for each class
    "input": "2.500000",
    "cached_input": "0.250000",
    "cache_write": "3.100000",
    "cache_write_1h": "5.000000",
    "output": "10.000000",
}
USAGE = {
    "input_tokens": INPUT_TOKENS,
    "cached_input_tokens": CACHED_READS,
    "cache_write_tokens": 0,
    "output_tokens": OUTPUT_TOKENS,
    "reasoning_tokens": REASONING,
}
# (7 uncached x 2.50 + 4 cached x 0.25 + 5 output x 10.00) micro-units, rounded up once.
COST = "0.000069"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with FakeOpenAI(OPENAI_CREDENTIAL) as fake:
        block, env = fake.provider_config("fakeai")
        prices = "".join(f'{name}_price_per_mtok = "{p}"\n' for name, p in PRICES.items())
        model = f'\n[models."{MODEL}"]\nprovider = "fakeai"\nupstream = "cached"\n{prices}'
        folder = tmp_path_factory.mktemp("receipt-v3")
        with GatewayProcess(folder, extra_config=block + model, env=env) as process:
            yield process


@pytest.fixture(scope="module")
def issued(gw) -> tuple[dict, dict]:
    """(the receipt as GET /v1/receipts shows it, its proof once logged)."""
    project = gw.create_project("receipt-v3", "--balance", "1")
    key = gw.create_key(project, "inference,receipts")
    with httpx.Client(base_url=gw.url, headers={"x-api-key": key}, timeout=30) as http:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        answer = http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        receipt_id = answer.headers["x-receipt-id"]
        proof = wait_proof(http, receipt_id)
        receipt = http.get(f"/v1/receipts/{receipt_id}").json()
    return receipt, proof


@pytest.fixture(scope="module")
def public_key(gw) -> str:
    return httpx.get(f"{gw.url}/api/proofs/keys").json()["data"][0]["public_key"]


def save(tmp_path, doc: dict, name: str = "proof.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_receipt_priced_by_class_is_logged_as_version_3(issued):
    receipt, proof = issued
    public = proof["receipt"]
    assert public["v"] == 3
    assert set(public) == set(PublicReceiptV3.__struct_fields__)
    assert public["usage"] == receipt["usage"] == USAGE
    assert public["prices"] == receipt["prices"] == PRICES
    assert public["cost"] == receipt["cost"] == COST
    assert (public["id"], public["usage_source"]) == (receipt["id"], "provider")


def test_gateway_verify_accepts_its_proof(tmp_path, issued, public_key):
    code, report, output = verify(save(tmp_path, issued[1]), "--key", public_key, "--json")
    assert code == 0, output
    assert report["ok"] and report["key_trusted"]
    assert (report["receipt_id"], report["cost"]) == (issued[0]["id"], COST)


# Well-formed changes of what the receipt bills: the log's proof no longer leads to them.
ALTERED = {
    "a price": lambda r: r["prices"].update(cached_input=PRICES["input"]),
    "a price dropped": lambda r: r["prices"].pop("cache_write_1h"),
    "a class count": lambda r: r["usage"].update(cached_input_tokens=0),
    "a class added": lambda r: r["usage"].update(cache_write_1h_tokens=1),
}
# Leaves no version describes: refused before any proof is checked.
UNKNOWN = {
    "an unknown field": lambda r: r.update(discount="0.000001"),
    "v 4": lambda r: r.update(v=4),
    "v3 as v2": lambda r: r.update(v=2),
    "v3 without v": lambda r: r.pop("v"),
    "a price not in USD": lambda r: r["prices"].update(input="2.5"),
}


@pytest.mark.parametrize("change", ALTERED.values(), ids=ALTERED.keys())
def test_an_altered_version_3_receipt_fails(tmp_path, issued, public_key, change):
    doc = copy.deepcopy(issued[1])
    change(doc["receipt"])
    code, report, output = verify(save(tmp_path, doc), "--key", public_key, "--json")
    assert code == 1, output
    assert report["reasons"] == [
        "the inclusion proof does not lead from the receipt to the tree head root"
    ]


@pytest.mark.parametrize("change", UNKNOWN.values(), ids=UNKNOWN.keys())
def test_a_leaf_of_no_known_version_is_refused(tmp_path, issued, public_key, change):
    doc = copy.deepcopy(issued[1])
    change(doc["receipt"])
    code, report, output = verify(save(tmp_path, doc), "--key", public_key, "--json")
    assert code == 1, output
    [reason] = report["reasons"]
    assert reason.startswith("malformed proof document"), reason


def test_a_log_of_every_version_verifies_leaf_by_leaf(tmp_path, issued):
    """A log upgraded twice: a v1 leaf, a v2 leaf, then the v3 leaf the gateway made,
    under one signed head (this test's key): `gateway verify` accepts each proof."""
    key = SigningKey.generate()
    v3 = receipt_from_builtins(issued[1]["receipt"])
    receipts = [make_receipt_v1(0), make_receipt(1), v3]
    tree = MerkleTree()
    tree.extend(receipt_leaf_hash(receipt) for receipt in receipts)
    head = sign_tree_head(key, tree.size, tree.root(), format_timestamp(T0 + tree.size))
    for index, receipt in enumerate(receipts):
        document = proof_document(
            receipt=receipt,
            # Leaves logged before tiles, v1 among them, were signed one by one.
            receipt_signature=sign_receipt(key, receipt) if index == 0 else None,
            public_key=key.public_key,
            leaf_index=index,
            inclusion_proof=tree.inclusion_proof(index),
            tree_head=head,
        )
        doc = orjson.loads(msgspec.json.encode(document))
        assert doc["receipt"].get("v") == [None, 2, 3][index]
        path = save(tmp_path, doc, f"leaf-{index}.json")
        code, report, output = verify(path, "--key", key.public_key.hex(), "--json")
        assert code == 0, output
        assert report["ok"] and report["leaf_index"] == index
