"""Tile math against the in-memory reference tree (merkle.MerkleTree, the RFC recursion
over every level): the tiles the right edge emits are exactly the C2SP tiles, and roots
and proofs computed from stored tiles equal the reference ones, for every size up to a
thousand leaves and tile heights 1, 2 and 8 (so partial tiles appear at every level)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_gateway.gateway.proofs.merkle import HASH_SIZE, MerkleTree, leaf_hash
from model_gateway.gateway.proofs.tiles import (
    TiledTree,
    TileEdge,
    edge_tiles,
    index_path,
    parse_tile_path,
    perfect_root,
    tile_path,
    tile_width_at,
    tiles_needed,
)

LEAVES = [leaf_hash(b"entry %d" % i) for i in range(1100)]


def expected_layout(size: int, height: int) -> dict[tuple[int, int], int]:
    """(level, index) -> width of every tile of a tree of `size`, from the spec's words."""
    width, layout, level = 1 << height, {}, 0
    while size >> (height * level):
        count = size >> (height * level)
        for n in range(count // width):
            layout[(level, n)] = width
        if count % width:
            layout[(level, count // width)] = count % width
        level += 1
    return layout


def grow(sizes: list[int], height: int) -> tuple[TileEdge, dict]:
    """Append LEAVES in batches ending at each of `sizes`; the stored tiles as a backend
    keeps them (a changed tile replaces the stored one)."""
    edge, stored, done = TileEdge(height=height), {}, 0
    for size in sizes:
        for key, tile in edge.append(LEAVES[done:size]).items():
            old = stored.get(key, b"")
            assert tile.startswith(old), f"tile {key} changed hashes it had published"
            stored[key] = tile
        done = size
    return edge, stored


batches = st.lists(st.integers(1, 1000), min_size=1, max_size=6).map(sorted)
heights = st.sampled_from([1, 2, 3, 8])


@settings(max_examples=150, deadline=None)
@given(batches, heights, st.data())
def test_tiles_are_the_c2sp_tiles_and_give_the_reference_roots_and_proofs(sizes, height, data):
    size = sizes[-1]
    reference = MerkleTree(LEAVES[:size])
    edge, stored = grow(sizes, height)
    width = 1 << height
    # Exactly the tiles of the spec, with exactly its widths.
    assert {key: len(tile) // HASH_SIZE for key, tile in stored.items()} == expected_layout(
        size, height
    )
    for (level, n), tile in stored.items():
        assert tile_width_at(size, level, n, height) == len(tile) // HASH_SIZE
        for i in range(len(tile) // HASH_SIZE):
            lo, hi = (n * width + i) * width**level, (n * width + i + 1) * width**level
            assert tile[i * HASH_SIZE : (i + 1) * HASH_SIZE] == reference._hash(lo, hi)
    assert edge.size == size
    assert edge.root() == reference.root()
    # Any earlier size, from today's tiles (a partial tile answers for its prefixes).
    old = data.draw(st.integers(1, size), label="old size")
    index = data.draw(st.integers(0, old - 1), label="leaf index")
    for tree_size in (old, size):
        tree = TiledTree(tree_size, stored, height)
        assert tree.root() == reference.root(tree_size)
        assert tree.inclusion_proof(index) == reference.inclusion_proof(index, tree_size)
    assert TiledTree(size, stored, height).consistency_proof(old) == reference.consistency_proof(
        old, size
    )

    # The planner names every tile a computation reads: those alone suffice.
    def compute(tree):
        return tree.inclusion_proof(index), tree.consistency_proof(old), tree.root()

    wanted = tiles_needed(size, compute, height)
    only = TiledTree(size, {k: stored[k] for k in wanted}, height)
    assert compute(only) == compute(TiledTree(size, stored, height))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 1000), st.integers(1, 100), heights)
def test_an_edge_reloaded_from_stored_tiles_continues_the_same_tree(size, more, height):
    _, stored = grow([size] if size else [], height)
    edge = TileEdge(size, stored, height)
    changed = edge.append(LEAVES[size : size + more])
    _, straight = grow([size + more], height)
    for key, tile in changed.items():
        assert straight[key] == tile
    assert edge.root() == MerkleTree(LEAVES[: size + more]).root()
    assert {(lvl, n) for lvl, n, _ in edge_tiles(size + more, height)} <= set(changed) | set(stored)


def test_the_spec_examples_of_partial_tiles():
    # "a tree of size 70,000 will be represented by 273 full level 0 tiles, one partial
    # level 0 tile of width 112, one full level 1 tile, one partial level 1 tile of width
    # 17, and one partial level 2 tile of width 1"
    layout = expected_layout(70_000, 8)
    assert sum(1 for (lvl, _), w in layout.items() if lvl == 0 and w == 256) == 273
    assert edge_tiles(70_000) == [(0, 273, 112), (1, 1, 17), (2, 0, 1)]
    assert tile_width_at(70_000, 1, 0) == 256
    # "a tree of size 256 will be represented by a full level 0 tile and a partial level 1
    # tile of width 1"
    assert edge_tiles(256) == [(1, 0, 1)] and tile_width_at(256, 0, 0) == 256


def test_a_missing_or_short_tile_is_an_error_not_a_wrong_hash():
    _, stored = grow([300], 8)
    short = dict(stored)
    short[(0, 1)] = stored[(0, 1)][: 10 * HASH_SIZE]
    with pytest.raises(KeyError):
        TiledTree(300, short).root()
    with pytest.raises(KeyError):
        TiledTree(300, {}).inclusion_proof(3)


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "000"), (5, "005"), (999, "999"), (1000, "x001/000"), (1234067, "x001/x234/067")],
)
def test_index_paths(n, text):
    assert index_path(n) == text
    assert parse_tile_path(f"0/{text}") == (0, n, 256)


levels = st.one_of(st.just("entries"), st.integers(0, 63))


@given(levels, st.integers(0, 10**12), st.integers(1, 256))
def test_tile_paths_round_trip(level, index, width):
    path = tile_path(level, index, width)
    assert path.startswith("tile/")
    assert parse_tile_path(path.removeprefix("tile/")) == (level, index, width)


@pytest.mark.parametrize(
    "path",
    [
        "0/x000/001",  # not canonical
        "00/001",  # leading zero in the level
        "64/000",  # level out of range
        "0/1",
        "0/001.p/0",
        "0/001.p/256",  # a full tile has no suffix
        "0/001.p/007",
        "0/001/",
        "entries/001.p/",
        "entry/001",
        "0/x1/001",
    ],
)
def test_non_canonical_tile_paths_are_refused(path):
    assert parse_tile_path(path) is None


def test_perfect_root_refuses_a_run_that_is_not_a_power_of_two():
    with pytest.raises(ValueError):
        perfect_root(hashlib.sha256(b"x").digest() * 3)
