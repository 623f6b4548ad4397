"""Merkle tree hashing and proofs of RFC 9162 section 2.1.

A leaf hashes as SHA-256(0x00 || data), an interior node as SHA-256(0x01 || left || right),
and the tree over n leaves splits at the largest power of two below n. Proofs are generated
from the recursive definitions (PATH, SUBPROOF) and verified with the RFC's bit-walking
algorithms (2.1.3.2, 2.1.4.2): two independent formulations, so the tests of one check the
other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


class _Level:
    """One row of hashes packed in one buffer: 32 bytes a node, where a list of `bytes`
    objects costs about 80 (the tree holds two nodes per receipt ever issued)."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def __len__(self) -> int:
        return len(self._buffer) // HASH_SIZE

    def __getitem__(self, i: int) -> bytes:
        return bytes(self._buffer[i * HASH_SIZE : (i + 1) * HASH_SIZE])

    def append(self, node: bytes) -> None:
        self._buffer += node

    def last_pair(self) -> tuple[bytes, bytes]:
        return bytes(self._buffer[-2 * HASH_SIZE : -HASH_SIZE]), bytes(self._buffer[-HASH_SIZE:])


class RangeHashes:
    """The RFC 9162 recursions (MTH, PATH, SUBPROOF) over any store of perfect subtrees.

    Every subtree the recursion visits is either perfect (2**h leaves at an offset aligned
    to its size) or a right edge made of O(log n) perfect ones, so a subclass only says how
    to find the hash of a perfect subtree: `perfect(height, index)` for leaves
    [index * 2**height, (index + 1) * 2**height). MerkleTree keeps every level in memory;
    tiles.TiledTree reads them from stored tiles.
    """

    @property
    def size(self) -> int:
        raise NotImplementedError

    def perfect(self, height: int, index: int) -> bytes:
        raise NotImplementedError

    def root(self, size: int | None = None) -> bytes:
        """MTH of the first `size` leaves (default: all of them)."""
        return self._hash(0, self._size(size))

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """PATH(index, D[0:size]): sibling hashes from the leaf up to the root."""
        size = self._size(size)
        if not 0 <= index < size:
            raise ValueError(f"leaf {index} is not in a tree of {size}")
        return self._path(index, 0, size)

    def consistency_proof(self, old_size: int, size: int | None = None) -> list[bytes]:
        """PROOF(old_size, D[0:size]): shows the tree of `old_size` is a prefix of this one."""
        size = self._size(size)
        if not 0 <= old_size <= size:
            raise ValueError(f"no consistency proof from {old_size} to {size}")
        if old_size == 0:
            return []  # every tree extends the empty one
        return self._subproof(old_size, 0, size, True)

    def _size(self, size: int | None) -> int:
        if size is None:
            return self.size
        if not 0 <= size <= self.size:
            raise ValueError(f"the tree has {self.size} leaves, not {size}")
        return size

    def _hash(self, lo: int, hi: int) -> bytes:
        """MTH(D[lo:hi]) for a range the RFC recursion can reach."""
        n = hi - lo
        if n == 0:
            return EMPTY_ROOT
        height = n.bit_length() - 1
        if n == 1 << height:
            # The recursion reaches a perfect subtree only at an offset aligned to its size.
            return self.perfect(height, lo >> height)
        mid = lo + _split(n)
        return node_hash(self._hash(lo, mid), self._hash(mid, hi))

    def _path(self, index: int, lo: int, hi: int) -> list[bytes]:
        if hi - lo == 1:
            return []
        mid = lo + _split(hi - lo)
        if index < mid:
            return [*self._path(index, lo, mid), self._hash(mid, hi)]
        return [*self._path(index, mid, hi), self._hash(lo, mid)]

    def _subproof(self, old_end: int, lo: int, hi: int, known: bool) -> list[bytes]:
        # SUBPROOF(m, D[lo:hi], b) with m = old_end - lo. `known` is the RFC's b: the range
        # is still the old tree itself, whose root the verifier already holds.
        if old_end == hi:
            return [] if known else [self._hash(lo, hi)]
        mid = lo + _split(hi - lo)
        if old_end <= mid:
            return [*self._subproof(old_end, lo, mid, known), self._hash(mid, hi)]
        return [*self._subproof(old_end, mid, hi, False), self._hash(lo, mid)]


class MerkleTree(RangeHashes):
    """An append-only tree over leaf hashes, every level in memory (~66 bytes a leaf):
    the reference the tiled log is tested against, and a verifier's scratch tree.

    `_levels[h][i]` caches the perfect subtree of 2**h leaves that starts at leaf i * 2**h,
    so after an O(n) build a root or proof costs O(log² n) hashes.
    """

    def __init__(self, leaf_hashes: Iterable[bytes] = ()) -> None:
        self._levels: list[_Level] = [_Level()]
        self.extend(leaf_hashes)

    @property
    def size(self) -> int:
        return len(self._levels[0])

    def perfect(self, height: int, index: int) -> bytes:
        return self._levels[height][index]

    def extend(self, leaf_hashes: Iterable[bytes]) -> None:
        for leaf in leaf_hashes:
            if len(leaf) != HASH_SIZE:
                raise ValueError("a leaf hash is 32 bytes")
            self._levels[0].append(leaf)
            height = 0
            # An even count at a level means its last two subtrees just completed a parent.
            while len(self._levels[height]) % 2 == 0:
                if height + 1 == len(self._levels):
                    self._levels.append(_Level())
                self._levels[height + 1].append(node_hash(*self._levels[height].last_pair()))
                height += 1


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    return MerkleTree(leaf_hashes).root()


def inclusion_proof(index: int, leaf_hashes: Sequence[bytes]) -> list[bytes]:
    return MerkleTree(leaf_hashes).inclusion_proof(index)


def consistency_proof(old_size: int, leaf_hashes: Sequence[bytes]) -> list[bytes]:
    return MerkleTree(leaf_hashes).consistency_proof(old_size)


def _all_hashes(*hashes: bytes) -> bool:
    # Only 32-byte values are hashes; anything else must not reach node_hash.
    return all(len(h) == HASH_SIZE for h in hashes)


def _shift_to_set_bit(fn: int, sn: int) -> tuple[int, int]:
    # Right-shift both until LSB(fn) is set or fn is 0: skips the levels where the node
    # is the last one of its row and so has no right sibling.
    while fn and not fn & 1:
        fn, sn = fn >> 1, sn >> 1
    return fn, sn


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], root_hash: bytes
) -> bool:
    """RFC 9162 2.1.3.2: does `proof` lead from leaf `index` to the root of tree `size`?"""
    if not 0 <= index < size or not _all_hashes(leaf, root_hash, *proof):
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            fn, sn = _shift_to_set_bit(fn, sn)
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root_hash


def verify_consistency(
    old_size: int, size: int, old_root: bytes, root_hash: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 2.1.4.2: is the tree (`old_size`, `old_root`) a prefix of (`size`, `root_hash`)?"""
    if not 0 <= old_size <= size or not _all_hashes(old_root, root_hash, *proof):
        return False
    # The RFC requires 0 < first < second; the two edge cases take an empty proof.
    if old_size == 0:
        return not proof and old_root == EMPTY_ROOT
    if old_size == size:
        return not proof and old_root == root_hash
    if not proof:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)  # the old tree is a perfect subtree: its root starts the path
    fn, sn = old_size - 1, size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            fn, sn = _shift_to_set_bit(fn, sn)
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == old_root and sr == root_hash
