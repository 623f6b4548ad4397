"""The transparency log integrator: settled receipts into the Merkle tree, off the hot path.

Settle writes a receipt and returns; nothing on the request path touches the log. A
background task wakes every `interval_s`, takes the oldest unlogged receipts, extends the
tree, signs the new tree head (as JSON and as a C2SP checkpoint) and stores the entries
(receipt id and leaf index), the tiles that changed and the head in one transaction. A
proof is served only once that transaction has committed, so every served proof leads to
a stored, signed head. No receipt is signed on its own any more: a signature costs ~35 µs,
and the head's signature with the inclusion proof already proves the receipt.

Memory is flat: the log keeps only the right edge of the tree (one partial tile a level,
tiles.TileEdge) and the latest head. Proofs are computed from stored tiles (a few tile
reads and at most ~500 hashes a level). The public receipt is not stored again: an entry
is rebuilt from its receipt row and checked against its leaf hash in the level-0 tile.
Leaves logged before tiles (log_leaves, with their bytes and signatures) are served as
they were; at the first start after the upgrade their tiles are built once.

One sequencer: several instances share one database and one log key, and exactly one of
them integrates and signs, the one that holds the storage's sequencer lock (PostgreSQL: a
session advisory lock; SQLite: a flock on a file beside the database, which the kernel
frees when its holder's process dies: the log process, or several processes on one
file). The others
follow: they serve proofs, checkpoints, tiles and entries from the stored log, catching up
with the latest stored head when asked for something newer and every `follow_s`, and try
for the lock as often. The one that gets it (its holder died or hung) reloads the right
edge from the stored tiles and goes on from the stored size. An append is conditional on
the stored size too (compare-and-set in storage): a stale sequencer, paused while another
took over, loses whole, reloads and asks for the lock again, so no two heads of one size
and no gap can ever be stored, whoever writes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol, TypeVar

import anyio
import msgspec

from model_gateway.gateway.cluster.background import stop_tasks
from model_gateway.gateway.metering.class_prices import split_usage
from model_gateway.gateway.metering.money import format_amount
from model_gateway.gateway.proofs.checkpoint import DEFAULT_ORIGIN, sign_checkpoint
from model_gateway.gateway.proofs.log_key import SigningKey, verify_signature
from model_gateway.gateway.proofs.merkle import EMPTY_ROOT, HASH_SIZE, RangeHashes, leaf_hash
from model_gateway.gateway.proofs.receipts import (
    AnyPublicReceipt,
    ProofDocument,
    PublicReceipt,
    PublicReceiptV1,
    PublicReceiptV3,
    SignedTreeHead,
    canonical_bytes,
    decode_receipt,
    format_timestamp,
    proof_document,
    sign_tree_head,
    tree_head_message,
)
from model_gateway.gateway.proofs.tiles import (
    TILE_HEIGHT,
    TiledTree,
    TileEdge,
    TileKey,
    edge_tiles,
    tile_width_at,
    tiles_needed,
)
from model_gateway.storage import LedgerPort, LogPort, ReceiptRecord
from model_gateway.storage.base import LogEntry, LogTile, StateConflict, TreeHeadRecord

log = logging.getLogger("gateway.proofs")

T = TypeVar("T")

INTERVAL_S = 0.25
# How often a follower catches up with the stored head and tries for the sequencer lock:
# after a sequencer dies, another takes over within about this long.
FOLLOW_S = 1.0
BATCH = 256
# Building public receipts costs ~10 µs each on the event loop: yield between chunks so
# that a full batch never holds requests up for more than a few milliseconds.
YIELD_EVERY = 64
# Leaves logged before tiles are read this many at a time when their tiles are built.
BACKFILL_CHUNK = 4096
# Rebuilding a full entry bundle from receipt rows costs ~9 ms (256 public receipts and
# their hashes): the last few full bundles, which never change, are kept (~120 KB each).
FULL_BUNDLES_KEPT = 8
# Receipts this process settled, kept until logged so the log need not read them back
# (~40 µs a receipt through the storage's view): a few intervals' worth at full load.
SETTLED_KEPT = 4096


class LogCorrupted(Exception):
    """The stored tiles, entries or receipts do not match the stored signed tree head."""


def public_receipt(record: ReceiptRecord) -> AnyPublicReceipt:
    """The receipt's public fields: what it ran and cost, never prompts, outputs, keys or
    the project. Validated, so a record that could never verify is caught here.

    Version 3 for a receipt priced by token class (its usage carries the prices applied),
    else version 2, with salted commitments, for every receipt issued with salts. A receipt
    written before salts existed (settled by the old code, not yet logged when the
    gateway was upgraded) has no commitment to publish and no body left to make one
    from: it is logged as version 1, as the code that issued it would have done."""
    fields: dict[str, object] = {
        "id": record.id,
        "issued_at": format_timestamp(record.created_at),
        "kind": record.kind,
        "endpoint": record.endpoint,
        "model_or_runtime": record.model_or_runtime,
        "status": record.status,
        "usage": dict(record.usage),
        "cost": format_amount(record.cost),
    }
    if record.request_salt is None:
        fields |= {
            "request_sha256": record.request_sha256,
            "response_sha256": record.response_sha256,
        }
        return msgspec.convert(fields, PublicReceiptV1)
    fields |= {
        "usage_source": record.usage_source,
        "request_commitment": record.request_commitment,
        "response_commitment": record.response_commitment,
    }
    counts, prices = split_usage(record.usage)
    if not prices:
        return msgspec.convert(fields, PublicReceipt)
    fields |= {"usage": counts, "prices": {k: format_amount(v) for k, v in prices.items()}}
    return msgspec.convert(fields, PublicReceiptV3)


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


class LogStore(LogPort, LedgerPort, Protocol):
    """What the log reads and writes: its leaves, tiles and sequencer, and the receipts
    it integrates."""


class TransparencyLog:
    def __init__(
        self,
        storage: LogStore,
        key: SigningKey,
        *,
        origin: str = DEFAULT_ORIGIN,
        interval_s: float = INTERVAL_S,
        follow_s: float = FOLLOW_S,
        batch: int = BATCH,
        offer_wait_s: float = 0.0,
    ) -> None:
        self.storage = storage
        self.key = key
        self.origin = origin
        self.interval_s = interval_s
        self.follow_s = follow_s
        self.batch = batch
        # How long a receipt that was not offered waits before it is read back: 0 where
        # offers come before the commit (this process's meter), more where they come after
        # it (the log process, fed over a pipe).
        self.offer_wait_s = offer_wait_s
        self.sequencer = False  # whether this process integrates (holds the storage's lock)
        self._edge = TileEdge()  # the right edge of the tree at self._head
        self._head: TreeHeadRecord | None = None  # the latest head known to be stored
        self._checkpoint: str | None = None  # self._head as a signed note
        self._lock = asyncio.Lock()  # one integration or reload at a time
        self._task: asyncio.Task[None] | None = None
        # Receipts that cannot be made public, reported once, until the log passes them.
        self._skipped: set[str] = set()
        self._bundles: OrderedDict[int, list[bytes]] = OrderedDict()  # full bundles, LRU
        self._settled: OrderedDict[str, ReceiptRecord] = OrderedDict()  # see offer()
        # When the receipt that waited longest for the log at its last look was issued, or
        # that look's time when none waited (wall-clock seconds): see integration_lag_s.
        self._waiting_since = time.time()
        # The first receipt not offered, and when it was first found so (monotonic): an
        # offer of it may still come for `offer_wait_s`.
        self._unoffered: tuple[str, float] | None = None
        # Receipts integrated from a whole read of storage rather than from offer(): settled
        # by another process or before this one started (or, in the log process, not fed).
        self.read_back = 0

    @property
    def integration_lag_s(self) -> float:
        """How long the oldest receipt not yet logged, as found at the log's last look (once
        the batch it took was stored), has been waiting; with none found, the time since that
        look. A log that keeps up shows about its interval under any load; one that falls
        behind, cannot store its batches or stopped looking shows a growing lag."""
        return max(0.0, time.time() - self._waiting_since)

    def _looked(self, waiting: list[tuple[str, int]], stored: int) -> None:
        """A look found `waiting` (ids and issue times in µs, oldest first, one past its
        batch when there were more), and the first `stored` of them are in the log now."""
        self._waiting_since = waiting[stored][1] / 1e6 if stored < len(waiting) else time.time()

    @property
    def size(self) -> int:
        """Leaves covered by the latest stored signed tree head."""
        return 0 if self._head is None else self._head.size

    async def start(self) -> None:
        async with self._lock:
            await self._reload()
        await self._claim()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            with anyio.CancelScope(shield=True):
                await stop_tasks(self._task)
                self._task = None
                # Receipts settled during shutdown: integrate now rather than at next start
                # (or rather than leaving them to the next sequencer); no more offers come.
                self.offer_wait_s = 0
                with anyio.move_on_after(2):
                    try:
                        if await self._claim():
                            await self.integrate()
                    except Exception:
                        log.exception("final log integration failed; the next start does it")

    async def _run(self) -> None:
        while True:
            try:
                if await self._claim():
                    # A backlog: keep going without sleeping, holding the lock each batch.
                    while await self.integrate() >= self.batch and await self._claim():
                        pass
                else:
                    await self._follow()
            except StateConflict:
                # Another process appended first (integrate reloaded what it stored): the
                # next claim says whether this one still holds the lock.
                log.warning("another process appended to the log first; reloaded the log")
            except Exception:
                log.exception("log integration failed; retrying")
            await asyncio.sleep(self.interval_s if self.sequencer else self.follow_s)

    def offer(self, record: ReceiptRecord) -> None:
        """A receipt this process is settling (its commit may be under way or done): the
        sequencer logs it from memory. Only a hint: what is logged, and in which order, is
        read from storage, so a receipt offered but never committed is never logged."""
        if self.sequencer:
            self._settled[record.id] = record
            if len(self._settled) > SETTLED_KEPT:
                self._settled.popitem(last=False)

    async def _claim(self) -> bool:
        """Ask the storage whether this process is (still, or now) the sequencer."""
        held = await self.storage.claim_log_sequencer()
        if held and not self.sequencer:
            async with self._lock:  # go on from the stored tree, not from what we knew
                await self._catch_up()
            log.info("log sequencer: this process integrates now, from tree size %d", self.size)
        elif self.sequencer and not held:
            log.warning("log sequencer: lock lost; this process follows the stored log now")
        self.sequencer = held
        return held

    async def _follow(self) -> None:
        """Keep up with the sequencer: its latest head, and whether it has every receipt."""
        await self.latest()
        self._looked(await self.storage.unlogged_receipt_ids(1), 0)

    async def _next_batch(self) -> tuple[list[ReceiptRecord], list[tuple[str, int]]]:
        """The next unlogged receipts in issue order, and what was found waiting (for the
        lag). From memory when this process offered them all; while an offer of the first
        one not offered may still come (the log process is fed after the commit), the ones
        ahead of it; else read whole from storage (settled by another process, or before
        this one started)."""
        limit = self.batch + len(self._skipped)
        found = await self.storage.unlogged_receipt_ids(limit + 1)
        if self._skipped:
            # A skipped receipt stops coming back once the log has passed it (or, on
            # storage that keeps a queue, once it left the queue): forget it, or the set
            # only grows.
            self._skipped.intersection_update(receipt_id for receipt_id, _ in found)
        waiting = [w for w in found if w[0] not in self._skipped]
        batch = waiting[: self.batch]
        offered = list(itertools.takewhile(lambda w: w[0] in self._settled, batch))
        if len(offered) == len(batch) or self._may_come(batch[len(offered)][0]):
            return [self._settled[receipt_id] for receipt_id, _ in offered], waiting
        records = await self.storage.unlogged_receipts(limit)
        records = [r for r in records if r.id not in self._skipped][: self.batch]
        self.read_back += len(records)
        return records, waiting

    def _may_come(self, receipt_id: str) -> bool:
        """Whether an offer of this receipt, the first one not offered, may still come: it
        has been so for less than `offer_wait_s` (timed here, whatever its issue time says:
        another instance's clock may run ahead)."""
        if self.offer_wait_s <= 0:
            return False
        now = time.monotonic()
        if self._unoffered is None or self._unoffered[0] != receipt_id:
            self._unoffered = (receipt_id, now)
        return now - self._unoffered[1] < self.offer_wait_s

    async def integrate(self) -> int:
        """Append one batch of unlogged receipts; return how many were taken."""
        async with self._lock:
            records, waiting = await self._next_batch()
            self._looked(waiting, 0)  # and again once the batch is stored
            if not records:
                return 0
            await self._catch_up()
            entries: list[LogEntry] = []
            hashes: list[bytes] = []
            unloggable: list[str] = []
            for n, record in enumerate(records, 1):
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                try:
                    receipt = public_receipt(record)
                except msgspec.ValidationError as exc:
                    log.error("receipt %s cannot be logged: %s", record.id, exc)
                    unloggable.append(record.id)
                    continue
                entries.append(
                    LogEntry(leaf_index=self._edge.size + len(entries), receipt_id=record.id)
                )
                hashes.append(leaf_hash(canonical_bytes(receipt)))
            if unloggable:
                await self.storage.skip_unloggable(unloggable)
                self._skipped.update(unloggable)
                for receipt_id in unloggable:
                    self._settled.pop(receipt_id, None)
            if not entries:
                self._looked(waiting, len(records))
                return len(records)
            try:
                changed = self._edge.append(hashes)
                head = self._sign_head(self._edge.size, self._edge.root())
                await self.storage.append_log_tiles(entries, _tile_list(changed), head)
            except BaseException:
                # Another process appended first, or storage failed: the edge in memory is
                # ahead of storage. Start again from what is stored.
                await self._reload()
                raise
            self._set_head(head)
            self._looked(waiting, len(records))
            for record in records:
                self._settled.pop(record.id, None)
            return len(records)

    def _sign_head(self, size: int, root: bytes) -> TreeHeadRecord:
        signed = sign_tree_head(self.key, size, root, format_timestamp(time.time_ns() // 1000))
        return TreeHeadRecord(
            size=signed.size,
            root_hash=signed.root_hash,
            timestamp=signed.timestamp,
            key_id=signed.key_id,
            signature=signed.signature,
        )

    def _set_head(self, head: TreeHeadRecord) -> None:
        self._head = head
        self._checkpoint = sign_checkpoint(
            self.key, self.origin, head.size, bytes.fromhex(head.root_hash)
        )

    async def _reload(self) -> None:
        self._edge = TileEdge()
        self._head = None
        self._checkpoint = None
        await self._catch_up()

    async def _catch_up(self) -> None:
        """Take in the head (and the right edge) another process or an earlier run stored."""
        head = await self.storage.tree_head()
        if head is None or (self._head is not None and head.size <= self._head.size):
            return
        # A head is stored with its tiles, so the stored tiles cover it.
        edge = await self._edge_at(head.size)
        if edge.root().hex() != head.root_hash:
            raise LogCorrupted(
                f"the stored tiles do not hash to the signed tree head of size {head.size}"
            )
        # The checkpoint restates the head under our signature: sign only what we signed.
        if not verify_signature(
            self.key.public_key,
            bytes.fromhex(head.signature),
            tree_head_message(_head_struct(head)),
        ):
            raise LogCorrupted(f"the tree head of size {head.size} is not signed by the log key")
        self._edge = edge
        self._set_head(head)

    async def _edge_at(self, size: int) -> TileEdge:
        keys = [(level, index) for level, index, _ in edge_tiles(size)]
        try:
            return TileEdge(size, await self.storage.log_tiles(keys))
        except KeyError:
            pass
        # No tiles for this head: a log written before tiles. Build them from its leaves.
        await self._build_legacy_tiles(size)
        try:
            return TileEdge(size, await self.storage.log_tiles(keys))
        except KeyError:
            raise LogCorrupted(
                f"no stored tiles cover the signed tree head of size {size}"
            ) from None

    async def _build_legacy_tiles(self, size: int) -> None:
        """Tiles for the `size` leaves logged before tiles, from their stored bytes. Full
        tiles are written chunk by chunk (rewriting the same bytes is allowed, so an
        interrupted run just starts over); the partial ones last, once each."""
        edge, start, full_size = TileEdge(), 0, (1 << TILE_HEIGHT) * HASH_SIZE
        while start < size:
            leaves = await self.storage.log_leaves(start, min(BACKFILL_CHUNK, size - start))
            indexes = [leaf.leaf_index for leaf in leaves]
            if not leaves or indexes != list(range(start, start + len(leaves))):
                raise LogCorrupted(f"the log has no leaf {start} below its signed size {size}")
            changed = edge.append(leaf_hash(leaf.public_receipt) for leaf in leaves)
            start += len(leaves)
            full = {k: v for k, v in changed.items() if len(v) == full_size}
            # The partial tiles of the whole edge at the end: a level the last chunk did
            # not reach still has its partial tile to store.
            await self.storage.append_log_tiles(
                [], _tile_list(full | (edge.tiles() if start == size else {})), None
            )
        log.info("built the tiles of %d leaves logged before tiles", size)

    async def latest(self) -> tuple[TreeHeadRecord | None, str | None]:
        """The latest stored head and its checkpoint (catching up with other processes)."""
        stored = await self.storage.tree_head()
        if stored is not None and stored.size > self.size:
            async with self._lock:
                await self._catch_up()
        return self._head, self._checkpoint

    async def checkpoint(self) -> str:
        """The latest checkpoint; an empty log's is signed for size 0 (the empty root)."""
        _, note = await self.latest()
        if note is None:
            return sign_checkpoint(self.key, self.origin, 0, EMPTY_ROOT)
        return note

    async def _tree(
        self, size: int, compute: Callable[[RangeHashes], T], *extra: TileKey
    ) -> tuple[TiledTree, T]:
        """Run `compute(tree)` over the stored tiles of the tree of `size` (and fetch the
        `extra` tile keys with them)."""
        keys = tiles_needed(size, compute) | set(extra)
        tree = TiledTree(size, await self.storage.log_tiles(sorted(keys)))
        try:
            return tree, compute(tree)
        except KeyError as missing:
            raise LogCorrupted(f"tile {missing} is missing for a tree of size {size}") from None

    async def proof(self, receipt_id: str) -> ProofDocument[AnyPublicReceipt] | None:
        """The receipt's proof against the latest signed head; None when no receipt has
        this id; raises Pending when it exists but is not integrated yet."""
        signature = None
        index = await self.storage.log_entry_index(receipt_id)
        if index is not None:
            record = await self.storage.get_receipt(receipt_id)
            if record is None:
                raise LogCorrupted(f"leaf {index} names a receipt that does not exist")
            receipt: AnyPublicReceipt = public_receipt(record)
        else:
            leaf = await self.storage.log_leaf(receipt_id)  # logged before tiles
            if leaf is None:
                if await self.storage.get_receipt(receipt_id) is None:
                    return None
                raise Pending(receipt_id)
            index, signature = leaf.leaf_index, leaf.signature
            receipt = decode_receipt(leaf.public_receipt)  # the version it was logged as
        if self._head is None or index >= self._head.size:
            async with self._lock:  # integrated by another process since our last look
                await self._catch_up()
        head, checkpoint = self._head, self._checkpoint
        assert head is not None
        leaf_tile = (0, index >> TILE_HEIGHT)
        tree, path = await self._tree(head.size, lambda t: t.inclusion_proof(index), leaf_tile)
        offset = (index % (1 << TILE_HEIGHT)) * HASH_SIZE
        if tree.tiles[leaf_tile][offset : offset + HASH_SIZE] != leaf_hash(
            canonical_bytes(receipt)
        ):
            raise LogCorrupted(f"receipt {receipt_id} no longer matches its leaf {index}")
        return proof_document(
            receipt=receipt,
            receipt_signature=signature,
            public_key=self.key.public_key,
            leaf_index=index,
            inclusion_proof=path,
            tree_head=_head_struct(head),
            checkpoint=checkpoint,
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
        # A stored head's tiles are stored with it: no need to catch up first.
        _, proof = await self._tree(second, lambda t: t.consistency_proof(first))
        return _head_struct(heads["first"]), _head_struct(heads["second"]), proof

    async def tile(self, level: int, index: int, width: int) -> bytes | None:
        """The first `width` hashes of tile (level, index), if a signed head covers them."""
        if tile_width_at(self.size, level, index) < width:
            await self.latest()
            if tile_width_at(self.size, level, index) < width:
                return None
        tile = (await self.storage.log_tiles([(level, index)])).get((level, index), b"")
        if len(tile) < width * HASH_SIZE:
            raise LogCorrupted(f"tile {(level, index)} is shorter than its signed tree head")
        return tile[: width * HASH_SIZE]

    async def entries(self, index: int, width: int) -> list[bytes] | None:
        """The public receipts of leaves [index * 256, index * 256 + width), as logged, if
        a signed head covers them; each checked against its leaf hash."""
        full = width == 1 << TILE_HEIGHT
        if full and index in self._bundles:
            self._bundles.move_to_end(index)
            return self._bundles[index]
        hashes = await self.tile(0, index, width)
        if hashes is None:
            return None
        start = index << TILE_HEIGHT
        found = {
            leaf.leaf_index: leaf.public_receipt
            for leaf in await self.storage.log_leaves(start, width)
        }
        for n, (at, record) in enumerate(
            await self.storage.log_entry_receipts(start, start + width), 1
        ):
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # ~10 µs a receipt: never hold the loop for the bundle
            found[at] = canonical_bytes(public_receipt(record))
        bundle = []
        for i in range(width):
            entry = found.get(start + i)
            if entry is None or leaf_hash(entry) != hashes[i * HASH_SIZE : (i + 1) * HASH_SIZE]:
                raise LogCorrupted(f"entry {start + i} is missing or does not match its leaf hash")
            bundle.append(entry)
        if full:
            self._bundles[index] = bundle
            while len(self._bundles) > FULL_BUNDLES_KEPT:
                self._bundles.popitem(last=False)
        return bundle


def _tile_list(tiles: dict[tuple[int, int], bytes]) -> list[LogTile]:
    return [LogTile(level=level, index=index, hashes=h) for (level, index), h in tiles.items()]
