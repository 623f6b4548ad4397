"""The published log read by tests/proofs_e2e/c2sp_reader.py, a client that knows only the
C2SP formats: from a real `gateway serve` with `[proofs] origin` set, more than one tile of
billed chats. The checkpoint's signature verifies with the vkey from /api/proofs/keys, the
tiles give its root, a receipt's entry is found in the entry bundles and proven included,
and two checkpoints are proven consistent, all from tiles alone."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.proofs_e2e import c2sp_reader as c2sp
from tests.proofs_e2e.conftest import chat, wait_proof
from tests.support.gateway_process import GatewayProcess

ORIGIN = "receipts.example.test/log"
LEAVES = 300  # past one full level-0 tile, so level 1 exists (partial, width 1)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("c2sp")
    with GatewayProcess(folder, extra_config=f'\n[proofs]\norigin = "{ORIGIN}"\n') as gateway:
        project = gateway.create_project("c2sp-reader", "--balance", "5")
        key = gateway.create_key(project, "inference,receipts")
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            yield gateway, http, key


def reader(http: httpx.Client) -> c2sp.Log:
    keys = http.get("/api/proofs/keys").json()["data"]
    verifier = c2sp.parse_vkey(keys[0]["vkey"])
    return c2sp.Log(http, "/api/proofs/log", verifier)


def bill(http, key, count: int) -> list[str]:
    ids = [chat(http, key, f"chat {i}") for i in range(count)]
    wait_proof(http, ids[-1])  # integrated in settlement order: the last one closes them all
    return ids


def test_the_checkpoint_is_a_signed_note_under_the_configured_origin(served):
    _, http, key = served
    bill(http, key, 1)
    keys = http.get("/api/proofs/keys").json()["data"][0]
    assert keys["vkey"].startswith(ORIGIN + "+")
    assert c2sp.parse_vkey(keys["vkey"]).public_key.hex() == keys["public_key"]
    response = http.get("/api/proofs/log/checkpoint")
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.headers["cache-control"] == "no-cache"
    checkpoint = reader(http).checkpoint()
    assert checkpoint.origin == ORIGIN and checkpoint.size >= 1
    lines = response.text.split("\n")
    assert lines[:2] == [ORIGIN, str(checkpoint.size)] and lines[3] == ""
    assert lines[4].startswith(f"\u2014 {ORIGIN} ")


def test_a_checkpoint_altered_or_read_with_another_key_is_refused(served):
    _, http, _ = served
    note = http.get("/api/proofs/log/checkpoint").text
    log = reader(http)
    origin, size, root, *rest = note.split("\n")
    with pytest.raises(c2sp.Invalid):
        c2sp.open_note("\n".join([origin, str(int(size) + 1), root, *rest]), log.verifier)
    other = c2sp.Verifier(log.verifier.name, log.verifier.key_id, bytes(31) + b"\x01")
    with pytest.raises(c2sp.Invalid):
        c2sp.open_note(note, other)
    stranger = c2sp.Verifier("someone.example/log", log.verifier.key_id, log.verifier.public_key)
    with pytest.raises(c2sp.Invalid, match="not signed by the log's key"):
        c2sp.open_note(note, stranger)


def test_tiles_give_the_root_an_inclusion_and_a_consistency(served):
    _, http, key = served
    first_ids = bill(http, key, LEAVES)
    log = reader(http)
    old = log.checkpoint()
    assert old.size >= LEAVES
    later_ids = bill(http, key, 7)
    new = log.checkpoint()
    assert new.size > old.size

    # The root of each checkpoint from the tiles that its size names.
    assert log.mth(0, new.size, new.size) == new.root
    assert log.mth(0, old.size, old.size) == old.root

    # A receipt found in the entry bundles, its leaf hash in the level-0 tile, included.
    wanted = first_ids[3]
    found = None
    for bundle in range((new.size + 255) // 256):
        for i, entry in enumerate(log.entries(bundle, new.size)):
            index = bundle * 256 + i
            tile = log.tile(0, bundle, new.size)
            assert c2sp.leaf(entry) == tile[i * 32 : (i + 1) * 32], f"entry {index}"
            if json.loads(entry)["id"] == wanted:
                found = index, entry
    assert found is not None, "the receipt is in no entry bundle"
    index, entry = found
    path = log.inclusion(index, new.size)
    assert c2sp.verify_inclusion(index, new.size, c2sp.leaf(entry), path, new.root)
    assert not c2sp.verify_inclusion(index, new.size, c2sp.leaf(entry + b" "), path, new.root)
    # The gateway's own proof document says the same.
    doc = wait_proof(http, wanted)
    assert doc["leaf_index"] == index
    assert json.loads(entry) == doc["receipt"]
    assert doc["checkpoint"].startswith(f"{ORIGIN}\n")

    # The older checkpoint is a prefix of the newer one.
    proof = log.consistency(old.size, new.size)
    assert c2sp.verify_consistency(old.size, new.size, old.root, new.root, proof)
    assert not c2sp.verify_consistency(old.size, new.size, new.root, new.root, proof)
    server = http.get(f"/api/proofs/consistency?first={old.size}&second={new.size}").json()
    assert [bytes.fromhex(h) for h in server["consistency_proof"]] == proof
    assert later_ids


def test_tiles_are_cached_as_the_spec_says_and_uncovered_ones_are_not_served(served):
    gateway, http, key = served
    bill(http, key, 1)
    log = reader(http)
    size = log.checkpoint().size
    assert size >= LEAVES
    full = http.get("/api/proofs/log/tile/0/000")
    assert full.status_code == 200 and len(full.content) == 256 * 32
    assert full.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert full.headers["content-type"] == "application/octet-stream"
    width = size % 256 or 256
    partial = http.get(f"/api/proofs/log/tile/0/{c2sp.index_path(size // 256)}.p/{width}")
    if width != 256:
        assert partial.status_code == 200 and len(partial.content) == width * 32
        assert "immutable" not in partial.headers["cache-control"]
    # An earlier width of the same tile is its prefix.
    narrower = http.get("/api/proofs/log/tile/0/000.p/5").content
    assert narrower == full.content[: 5 * 32]
    # Entry bundles are gzipped for clients that take it, and say so.
    raw = httpx.get(
        f"{gateway.url}/api/proofs/log/tile/entries/000", headers={"accept-encoding": "gzip"}
    )
    assert raw.headers["content-encoding"] == "gzip" and raw.headers["vary"] == "accept-encoding"
    assert len(raw.content) > 256 * 100  # decoded by httpx: the whole bundle
    beyond = size // 256 + 1
    for path in (
        f"tile/0/{c2sp.index_path(beyond)}",  # no head covers it
        f"tile/entries/{c2sp.index_path(beyond)}.p/1",
        "tile/1/000",  # level 1 is partial until 65,536 leaves
        "tile/0/x000/000",  # not canonical
        "tile/0/000.p/256",
        "tile/x/000",
    ):
        response = http.get(f"/api/proofs/log/{path}")
        assert response.status_code == 404, path
        assert response.json()["error"]["type"] == "not_found"
