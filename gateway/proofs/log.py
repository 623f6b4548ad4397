"""The transparency log integrator: settled receipts into the Merkle tree, off the hot path.

Settle writes a receipt and returns; nothing on the request path touches the log. A
background task wakes every `interval_s`, takes the oldest unlogged receipts, signs each
receipt's public fields, extends the tree, signs the new tree head and appends leaves and
head to storage in one transaction. A proof is served only once that transaction has
committed, so every served proof leads to a stored, signed head.

The tree is kept in memory (rebuilt from the stored leaves at start) so that proofs cost
O(log² n) hashes and no storage reads beyond the leaf itself. Several processes may share
one database: leaf indexes and tree sizes are primary keys, so an append that raced
another process fails as a whole, and the loser reloads the leaves it missed and retries.
"""

from __future__ import annotations

import asyncio
import logging
import time

import anyio
import msgspec

from gateway.money import format_amount
from gateway.proofs.merkle import MerkleTree, leaf_hash
from gateway.proofs.receipts import (
    ProofDocument,
    PublicReceipt,
    SignedTreeHead,
    canonical_bytes,
    format_timestamp,
    proof_document,
    sign_receipt,
    sign_tree_head,
)
from gateway.proofs.signing import SigningKey
from storage import ReceiptRecord, Storage
from storage.base import LogLeaf, TreeHeadRecord

log = logging.getLogger("gateway.proofs")

INTERVAL_S = 0.25
BATCH = 256
# Signing costs about 80 µs a receipt on the event loop: yield between chunks so that a
# full batch never holds requests up for more than a few milliseconds.
YIELD_EVERY = 32


class LogCorrupted(Exception):
    """The stored leaves do not hash to the stored signed tree head."""


def public_receipt(record: ReceiptRecord) -> PublicReceipt:
    """The receipt's public fields: what it ran and cost, never prompts, outputs, keys or
    the project. Validated, so a record that could never verify is caught here."""
    fields = {
        "id": record.id,
        "issued_at": format_timestamp(record.created_at),
        "kind": record.kind,
        "endpoint": record.endpoint,
        "model_or_runtime": record.model_or_runtime,
        "status": record.status,
        "usage": dict(record.usage),
        "cost": format_amount(record.cost),
        "request_sha256": record.request_sha256,
        "response_sha256": record.response_sha256,
    }
    return msgspec.convert(fields, PublicReceipt)


def _head_struct(head: TreeHeadRecord) -> SignedTreeHead:
    return SignedTreeHead(
        size=head.size,
        root_hash=head.root_hash,
        timestamp=head.timestamp,
        key_id=head.key_id,
        signature=head.signature,
    )


class Pending(Exception):
    """The receipt exists but is not in the log yet."""


class TransparencyLog:
    def __init__(
        self,
        storage: Storage,
        key: SigningKey,
        *,
        interval_s: float = INTERVAL_S,
        batch: int = BATCH,
    ) -> None:
        self.storage = storage
        self.key = key
        self.interval_s = interval_s
        self.batch = batch
        self._tree = MerkleTree()
        self._head: TreeHeadRecord | None = None  # the latest head known to be stored
        self._lock = asyncio.Lock()  # one integration or reload at a time
        self._task: asyncio.Task | None = None
        self._skipped: set[str] = set()  # receipts that cannot be made public (logged once)

    @property
    def size(self) -> int:
        """Leaves covered by the latest stored signed tree head."""
        return 0 if self._head is None else self._head.size

    async def start(self) -> None:
        async with self._lock:
            await self._reload()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(self._task, return_exceptions=True)
                self._task = None
                # Receipts settled during shutdown: integrate now rather than at next start.
                with anyio.move_on_after(2):
                    try:
                        await self.integrate()
                    except Exception:
                        log.exception("final log integration failed; the next start does it")

    async def _run(self) -> None:
        while True:
            try:
                while await self.integrate() >= self.batch:
                    pass  # a backlog: keep going without sleeping
            except Exception:
                log.exception("log integration failed; retrying")
            await asyncio.sleep(self.interval_s)

    async def integrate(self) -> int:
        """Append one batch of unlogged receipts; return how many were taken."""
        async with self._lock:
            records = await self.storage.unlogged_receipts(self.batch + len(self._skipped))
            records = [r for r in records if r.id not in self._skipped][: self.batch]
            if not records:
                return 0
            await self._catch_up()
            leaves = []
            for n, record in enumerate(records, 1):
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                try:
                    receipt = public_receipt(record)
                except msgspec.ValidationError as exc:
                    log.error("receipt %s cannot be logged: %s", record.id, exc)
                    self._skipped.add(record.id)
                    continue
                leaves.append(
                    LogLeaf(
                        leaf_index=self._tree.size + len(leaves),
                        receipt_id=record.id,
                        public_receipt=canonical_bytes(receipt),
                        signature=sign_receipt(self.key, receipt),
                    )
                )
            if not leaves:
                return len(records)
            self._tree.extend(leaf_hash(leaf.public_receipt) for leaf in leaves)
            signed = sign_tree_head(
                self.key,
                self._tree.size,
                self._tree.root(),
                format_timestamp(time.time_ns() // 1000),
            )
            head = TreeHeadRecord(
                size=signed.size,
                root_hash=signed.root_hash,
                timestamp=signed.timestamp,
                key_id=signed.key_id,
                signature=signed.signature,
            )
            try:
                await self.storage.append_log(leaves, head)
            except BaseException:
                # Another process appended first, or storage failed: the in-memory tree is
                # ahead of storage. Start again from what is stored.
                await self._reload()
                raise
            self._head = head
            return len(records)

    async def _reload(self) -> None:
        self._tree = MerkleTree()
        self._head = None
        await self._catch_up()

    async def _catch_up(self) -> None:
        """Take in leaves and the head that another process (or an earlier run) stored."""
        head = await self.storage.tree_head()
        if head is None or (self._head is not None and head.size <= self._head.size):
            return
        leaves = await self.storage.log_leaves(self._tree.size)
        tree_size = self._tree.size
        self._tree.extend(leaf_hash(leaf.public_receipt) for leaf in leaves)
        # A head is read before its leaves, so the stored leaves cover it.
        if self._tree.size < head.size or self._tree.root(head.size).hex() != head.root_hash:
            self._tree = MerkleTree()
            self._head = None
            raise LogCorrupted(
                f"stored log leaves do not match the signed tree head of size {head.size}"
                f" (had {tree_size} leaves in memory)"
            )
        self._head = head

    async def proof(self, receipt_id: str) -> ProofDocument | None:
        """The receipt's proof against the latest signed head; None when no receipt has
        this id; raises Pending when it exists but is not integrated yet."""
        leaf = await self.storage.log_leaf(receipt_id)
        if leaf is None:
            if await self.storage.get_receipt(receipt_id) is None:
                return None
            raise Pending(receipt_id)
        if self._head is None or leaf.leaf_index >= self._head.size:
            async with self._lock:  # integrated by another process since our last look
                await self._catch_up()
        head = self._head
        return proof_document(
            receipt=msgspec.json.decode(leaf.public_receipt, type=PublicReceipt),
            receipt_signature=leaf.signature,
            public_key=self.key.public_key,
            leaf_index=leaf.leaf_index,
            inclusion_proof=self._tree.inclusion_proof(leaf.leaf_index, head.size),
            tree_head=_head_struct(head),
        )

    async def consistency(
        self, first: int, second: int
    ) -> tuple[SignedTreeHead, SignedTreeHead, list[bytes]]:
        """Both signed heads and the RFC 9162 proof that the first tree is a prefix of the
        second. KeyError names the size ("first" or "second") that has no signed head."""
        heads = {}
        for name, size in (("first", first), ("second", second)):
            head = await self.storage.tree_head(size)
            if head is None:
                raise KeyError(name)
            heads[name] = head
        if second > self._tree.size:
            async with self._lock:
                await self._catch_up()
        proof = self._tree.consistency_proof(first, second)
        return _head_struct(heads["first"]), _head_struct(heads["second"]), proof
