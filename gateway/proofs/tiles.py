"""The Merkle tree as C2SP tlog-tiles (https://c2sp.org/tlog-tiles), RFC 6962 hashing.

A tile at level L, index N holds up to 256 consecutive hashes of that level, where a
level-L hash is the Merkle Tree Hash of 256**L leaves: entry i of tile (L, N) is
MTH(D[(N*256 + i) * 256**L : (N*256 + i + 1) * 256**L]). A full tile (256 hashes) never
changes; the rightmost tile of each level is partial, holds floor(size / 256**L) mod 256
hashes and only grows. Its first W hashes never change either, so one stored copy of a
growing tile answers for every narrower width ever published (`.p/W` is a prefix).

The tile height is a parameter only so that the property tests reach partial tiles at
five or more levels with a thousand leaves; the log always uses 8 (256-hash tiles).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from model_gateway.gateway.proofs.merkle import HASH_SIZE, RangeHashes, node_hash

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
MAX_LEVEL = 63

TileKey = tuple[int, int]  # (level, index)


def perfect_root(hashes: bytes) -> bytes:
    """MTH over a power-of-two run of concatenated 32-byte hashes (a perfect subtree)."""
    row = [hashes[i : i + HASH_SIZE] for i in range(0, len(hashes), HASH_SIZE)]
    if not row or len(row) & (len(row) - 1):
        raise ValueError(f"{len(row)} hashes do not make a perfect subtree")
    while len(row) > 1:
        row = [node_hash(row[i], row[i + 1]) for i in range(0, len(row), 2)]
    return row[0]


def tile_width_at(size: int, level: int, index: int, height: int = TILE_HEIGHT) -> int:
    """How many hashes tile (level, index) holds in a tree of `size` leaves (0: none yet)."""
    width = 1 << height
    hashes_at_level = size >> (height * level)
    return max(0, min(width, hashes_at_level - index * width))


def edge_tiles(size: int, height: int = TILE_HEIGHT) -> list[tuple[int, int, int]]:
    """The partial tiles of a tree of `size`: (level, index, width) for every level whose
    rightmost tile is not full. Together they hold the tree's compact range."""
    edge, level = [], 0
    while size >> (height * level):
        count = size >> (height * level)
        if count % (1 << height):
            edge.append((level, count >> height, count % (1 << height)))
        level += 1
    return edge


class TiledTree(RangeHashes):
    """Roots and proofs for a tree of `size` leaves from the tiles in `tiles`.

    A perfect subtree of height h sits in level h // height: it is the MTH of
    2**(h % height) consecutive hashes of one tile there (aligned runs never cross a
    tile), so any proof needs at most one or two tiles a level and hashes at most
    2 * 255 of their entries a level. A missing or short tile raises KeyError.
    """

    def __init__(self, size: int, tiles: dict[TileKey, bytes], height: int = TILE_HEIGHT) -> None:
        self._tree_size = size
        self.tiles = tiles
        self.height = height

    @property
    def size(self) -> int:
        return self._tree_size

    def locate(self, height: int, index: int) -> tuple[TileKey, int, int]:
        """Where perfect subtree (height, index) is: its tile and the entry run [lo, hi)."""
        level, below = divmod(height, self.height)
        first = index << below
        offset = first & ((1 << self.height) - 1)
        return (level, first >> self.height), offset, offset + (1 << below)

    def perfect(self, height: int, index: int) -> bytes:
        key, lo, hi = self.locate(height, index)
        tile = self.tiles[key]
        if len(tile) < hi * HASH_SIZE:
            raise KeyError(key)
        return perfect_root(tile[lo * HASH_SIZE : hi * HASH_SIZE])


class _Planner(TiledTree):
    """Runs a computation only to learn which tiles it reads (the recursion's shape does
    not depend on hash values), so that they are fetched in one storage round trip."""

    def __init__(self, size: int, height: int) -> None:
        super().__init__(size, {}, height)
        self.wanted: set[TileKey] = set()

    def perfect(self, height: int, index: int) -> bytes:
        self.wanted.add(self.locate(height, index)[0])
        return bytes(HASH_SIZE)


def tiles_needed(
    size: int, compute: Callable[[RangeHashes], object], height: int = TILE_HEIGHT
) -> set[TileKey]:
    """The tiles `compute(tree)` reads from a tree of `size` leaves."""
    planner = _Planner(size, height)
    compute(planner)
    return planner.wanted


class TileEdge:
    """The right edge of the tree: one partial tile per level, at most 255 hashes each
    (under 8 KiB a level; six levels cover 2**48 leaves). This is all the log keeps in
    memory: it holds the compact range, so it gives the root, and appending to it yields
    the tiles to store. Memory does not grow with the number of leaves."""

    def __init__(
        self, size: int = 0, tiles: dict[TileKey, bytes] | None = None, height: int = TILE_HEIGHT
    ) -> None:
        self.height = height
        self.size = size
        self._partial: list[bytearray] = []
        tiles = tiles or {}
        for level, index, width in edge_tiles(size, height):
            while len(self._partial) <= level:
                self._partial.append(bytearray())
            stored = tiles.get((level, index), b"")
            if len(stored) < width * HASH_SIZE:
                raise KeyError((level, index))
            self._partial[level] = bytearray(stored[: width * HASH_SIZE])

    def _tile_index(self, level: int) -> int:
        return (self.size >> (self.height * level)) >> self.height

    def append(self, leaf_hashes: Iterable[bytes]) -> dict[TileKey, bytes]:
        """Add leaves; return every tile that changed: tiles completed on the way (full,
        immutable from now on) and the edge's partial tiles as they now stand."""
        full_width = (1 << self.height) * HASH_SIZE
        changed: dict[TileKey, bytes] = {}
        touched: set[int] = set()
        for leaf in leaf_hashes:
            if len(leaf) != HASH_SIZE:
                raise ValueError("a leaf hash is 32 bytes")
            node, level = leaf, 0
            while True:
                if level == len(self._partial):
                    self._partial.append(bytearray())
                tile_index = self._tile_index(level)
                row = self._partial[level]
                row += node
                touched.add(level)
                if len(row) < full_width:
                    break
                # A tile just filled: it is stored as it is forever, and its root is the
                # next entry of the level above.
                changed[(level, tile_index)] = bytes(row)
                self._partial[level] = bytearray()
                node, level = perfect_root(bytes(row)), level + 1
            self.size += 1
        for level in touched:
            if self._partial[level]:
                changed[(level, self._tile_index(level))] = bytes(self._partial[level])
        return changed

    def tiles(self) -> dict[TileKey, bytes]:
        """The partial tiles (enough to compute the root)."""
        return {
            (level, self._tile_index(level)): bytes(row)
            for level, row in enumerate(self._partial)
            if row
        }

    def root(self) -> bytes:
        return TiledTree(self.size, self.tiles(), self.height).root()


# Paths: tile/<L>/<N>[.p/<W>] and tile/entries/<N>[.p/<W>], N in 3-digit groups, all but
# the last prefixed with x (1234067 -> x001/x234/067).


def index_path(n: int) -> str:
    groups = [f"{n % 1000:03d}"]
    n //= 1000
    while n:
        groups.append(f"x{n % 1000:03d}")
        n //= 1000
    return "/".join(reversed(groups))


def tile_path(level: int | str, index: int, width: int = TILE_WIDTH) -> str:
    """`tile/<level>/<N>[.p/<W>]`; level "entries" names an entry bundle."""
    suffix = "" if width == TILE_WIDTH else f".p/{width}"
    return f"tile/{level}/{index_path(index)}{suffix}"


# At most 7 groups of 3 digits: a tile index of a tree of 2**63 leaves has 17.
_TILE = re.compile(
    r"(entries|0|[1-9][0-9]?)/((?:x[0-9]{3}/){0,6}[0-9]{3})(?:\.p/([1-9][0-9]{0,2}))?"
)


def parse_tile_path(path: str) -> tuple[int | str, int, int] | None:
    """(level or "entries", index, width) of a path below tile/, or None when it is not a
    canonical C2SP tile path (leading x000 groups, widths out of 1..255, levels above 63)."""
    found = _TILE.fullmatch(path)
    if found is None:
        return None
    level_text, index_text, width_text = found.groups()
    level: int | str = level_text if level_text == "entries" else int(level_text)
    index = int(index_text.replace("x", "").replace("/", ""))
    width = TILE_WIDTH if width_text is None else int(width_text)
    if isinstance(level, int) and level > MAX_LEVEL:
        return None
    if width_text is not None and width >= TILE_WIDTH:  # a full tile has no .p/ suffix
        return None
    if index_path(index) != index_text:  # x000/001 is not a canonical 1
        return None
    return level, index, width
