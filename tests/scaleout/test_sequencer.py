"""One transparency log across instances: two real `gateway serve` processes on one fresh
PostgreSQL database, sharing one secrets folder (so one log key). Exactly one of them is
the sequencer; receipts billed through either get proofs from either, against one tree.
The sequencer killed (-9) or hung (SIGSTOP), the other takes over: the log goes on from
the stored size, every later checkpoint is consistent with every earlier one, and the
tiles, read as a C2SP client reads them, agree. Nothing here knows our tree code: proofs
are checked by `gateway verify`, the merkle verifier and tests/proofs_e2e/c2sp_reader.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import ExitStack

import httpx
import pytest

from model_gateway.gateway.proofs.verify import verify_proof_document
from tests.proofs_e2e import c2sp_reader as c2sp
from tests.support.gateway_process import GATEWAY, GatewayProcess
from tests.support.http import bearer, chat_body

pytestmark = pytest.mark.postgres

# A follower tries for the lock every second; a hung holder's session is ended by the
# server after 5 s of silence (storage/postgres/). Deadlines with room for a busy CPU.
TAKEOVER_S = 10.0
HUNG_TAKEOVER_S = 15.0


class Instance:
    def __init__(self, process: GatewayProcess) -> None:
        self.process = process
        self.http = httpx.Client(base_url=process.url, timeout=30)

    def health(self) -> dict:
        return self.http.get("/healthz").json()

    def is_sequencer(self) -> bool:
        return self.health()["log"]["sequencer"]

    def chat(self, key: str) -> str:
        response = self.http.post("/v1/chat/completions", headers=bearer(key), json=chat_body())
        assert response.status_code == 200, response.text
        return response.headers["x-receipt-id"]

    def proof(self, receipt_id: str, within_s: float = TAKEOVER_S) -> dict:
        """The proof document: 202 pending until the sequencer has integrated it."""
        deadline = time.monotonic() + within_s
        while True:
            response = self.http.get(f"/api/proofs/{receipt_id}")
            if response.status_code == 200:
                return response.json()
            assert response.status_code == 202, response.text
            assert time.monotonic() < deadline, f"{receipt_id} was never integrated"
            time.sleep(0.05)

    def reader(self) -> c2sp.Log:
        """A C2SP client of this instance's log, trusting the vkey it publishes."""
        vkey = self.http.get("/api/proofs/keys").json()["data"][0]["vkey"]
        return c2sp.Log(self.http, "/api/proofs/log", c2sp.parse_vkey(vkey))

    def gauge(self) -> float:
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith("gateway_log_sequencer "):
                return float(line.split()[1])
        raise AssertionError("no gateway_log_sequencer gauge")


@pytest.fixture
def deployment(tmp_path, fresh_postgres_url):
    """Two instances of one deployment, and a key with a balance."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    with ExitStack() as stack:
        instances = []
        for name in ("a", "b"):  # in turn: the first creates the shared log key
            folder = tmp_path / name
            folder.mkdir()
            process = GatewayProcess(
                folder, storage_url=fresh_postgres_url, secrets_dir=str(secrets)
            )
            stack.enter_context(process)
            instances.append(Instance(process))
            stack.callback(instances[-1].http.close)
        project = instances[0].process.create_project("one-log", "--balance", "5")
        key = instances[0].process.create_key(project, "inference,receipts")
        yield instances, key


def roles(instances: list[Instance]) -> tuple[Instance, Instance]:
    """(the sequencer, the follower): exactly one instance says it is the sequencer."""
    flags = [i.is_sequencer() for i in instances]
    assert sorted(flags) == [False, True], flags
    return (instances[0], instances[1]) if flags[0] else (instances[1], instances[0])


def public_key(instance: Instance) -> str:
    return instance.http.get("/api/proofs/keys").json()["data"][0]["public_key"]


def checked(doc: dict, key_hex: str) -> dict:
    result = verify_proof_document(doc, bytes.fromhex(key_hex))
    assert result.ok, result
    return doc


def gateway_verify(url: str, key_hex: str) -> None:
    done = subprocess.run(
        [GATEWAY, "verify", url, "--key", key_hex],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def assert_every_head_consistent(instance: Instance, latest: c2sp.Checkpoint) -> None:
    """Each signed head the log ever stored is a prefix of `latest`: no fork. The sizes
    with no head answer 400; a head is stored for every integration."""
    found = 0
    for size in range(1, latest.size):
        response = instance.http.get(
            "/api/proofs/consistency", params={"first": size, "second": latest.size}
        )
        if response.status_code == 400:
            continue
        body = response.json()
        assert body["second_tree_head"]["root_hash"] == latest.root.hex()
        proof = [bytes.fromhex(h) for h in body["consistency_proof"]]
        first_root = bytes.fromhex(body["first_tree_head"]["root_hash"])
        assert c2sp.verify_consistency(size, latest.size, first_root, latest.root, proof)
        found += 1
    assert found >= 1


def tree_from_tiles(instance: Instance, size: int) -> tuple[bytes, list[bytes]]:
    """The root that instance's tiles give for `size` leaves, and its entries."""
    reader = instance.reader()
    entries = [e for n in range((size + 255) // 256) for e in reader.entries(n, size)]
    assert len(entries) == size
    return reader.mth(0, size, size), entries


def test_receipts_from_both_instances_verify_against_one_log(deployment):
    instances, key = deployment
    sequencer, follower = roles(instances)
    assert (sequencer.gauge(), follower.gauge()) == (1.0, 0.0)
    key_hex = public_key(sequencer)
    assert public_key(follower) == key_hex

    receipts = [instances[n % 2].chat(key) for n in range(8)]
    docs = []
    for n, receipt_id in enumerate(receipts):
        # Each proof asked of the instance that did not serve the chat, then of the other.
        other, same = instances[(n + 1) % 2], instances[n % 2]
        docs.append(checked(other.proof(receipt_id), key_hex))
        checked(same.proof(receipt_id), key_hex)
    assert sorted(doc["leaf_index"] for doc in docs) == list(range(8))
    for instance, receipt_id in zip(instances, receipts[-2:], strict=True):
        gateway_verify(f"{instance.process.url}/api/proofs/{receipt_id}", key_hex)

    # One tree: the same checkpoint from both, and both instances' tiles give its root.
    notes = {i.http.get("/api/proofs/log/checkpoint").text for i in instances}
    assert len(notes) == 1
    checkpoint = sequencer.reader().checkpoint()
    assert checkpoint.size == 8
    roots = {tree_from_tiles(i, 8)[0] for i in instances}
    assert roots == {checkpoint.root}
    assert roles(instances) == (sequencer, follower)  # the follower never took over


def test_killing_the_sequencer_hands_the_log_on_with_no_gap_and_no_fork(deployment):
    instances, key = deployment
    sequencer, survivor = roles(instances)
    key_hex = public_key(survivor)
    before = [instances[n % 2].chat(key) for n in range(6)]
    survivor.proof(before[-1])
    old = survivor.reader().checkpoint()
    assert old.size == 6
    old_root, old_entries = tree_from_tiles(survivor, 6)
    assert old_root == old.root

    # The last receipts settle on the sequencer, which dies before integrating them.
    last = [sequencer.chat(key) for _ in range(3)]
    sequencer.process.kill()
    started = time.monotonic()
    after = [survivor.chat(key) for _ in range(3)]
    while not survivor.is_sequencer():
        assert time.monotonic() - started < TAKEOVER_S, "no instance took over"
        time.sleep(0.05)
    assert survivor.gauge() == 1.0
    docs = [checked(survivor.proof(r), key_hex) for r in before + last + after]
    # No gap: every receipt has its own leaf, 0..11, whoever settled it.
    assert sorted(doc["leaf_index"] for doc in docs) == list(range(12))
    assert "log sequencer: this process integrates now" in survivor.process.log()

    new = survivor.reader().checkpoint()
    assert new.size == 12
    # No fork: the old checkpoint is proven a prefix of the new one, as is every head.
    response = survivor.http.get("/api/proofs/consistency", params={"first": 6, "second": 12})
    body = response.json()
    assert body["first_tree_head"]["root_hash"] == old.root.hex()
    proof = [bytes.fromhex(h) for h in body["consistency_proof"]]
    assert c2sp.verify_consistency(6, 12, old.root, new.root, proof)
    assert_every_head_consistent(survivor, new)
    # The tiles agree: they give the new root, and the old tree's entries are their prefix.
    new_root, new_entries = tree_from_tiles(survivor, 12)
    assert new_root == new.root
    assert new_entries[:6] == old_entries
    gateway_verify(f"{survivor.process.url}/api/proofs/{after[-1]}", key_hex)


def test_a_hung_sequencer_is_replaced_and_cannot_fork_the_log_when_it_wakes(deployment):
    instances, key = deployment
    hung, successor = roles(instances)
    key_hex = public_key(successor)
    first = [instances[n % 2].chat(key) for n in range(4)]
    successor.proof(first[-1])
    old = successor.reader().checkpoint()

    os.killpg(hung.process.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        during = [successor.chat(key) for _ in range(3)]
        while not successor.is_sequencer():
            assert time.monotonic() - started < HUNG_TAKEOVER_S, "the hung sequencer kept the log"
            time.sleep(0.1)
        for receipt_id in during:
            checked(successor.proof(receipt_id), key_hex)
    finally:
        os.killpg(hung.process.process.pid, signal.SIGCONT)

    # Awake again, the old sequencer finds its lock gone and follows.
    deadline = time.monotonic() + TAKEOVER_S
    while hung.is_sequencer():
        assert time.monotonic() < deadline, "the woken sequencer did not step down"
        time.sleep(0.05)
    assert roles(instances) == (successor, hung)
    more = [instances[n % 2].chat(key) for n in range(4)]
    docs = [checked(hung.proof(r), key_hex) for r in first + during + more]
    assert sorted(doc["leaf_index"] for doc in docs) == list(range(11))
    notes = {i.http.get("/api/proofs/log/checkpoint").text for i in instances}
    assert len(notes) == 1
    new = hung.reader().checkpoint()
    assert new.size == 11
    assert_every_head_consistent(hung, new)
    assert c2sp.verify_consistency(
        old.size,
        new.size,
        old.root,
        new.root,
        [
            bytes.fromhex(h)
            for h in hung.http.get(
                "/api/proofs/consistency", params={"first": old.size, "second": new.size}
            ).json()["consistency_proof"]
        ],
    )
    assert tree_from_tiles(hung, 11)[0] == new.root
