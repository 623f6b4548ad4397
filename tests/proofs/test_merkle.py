import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_gateway.gateway.proofs.merkle import (
    EMPTY_ROOT,
    MerkleTree,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root,
    verify_consistency,
    verify_inclusion,
)

# The Certificate Transparency reference tree (RFC 6962 test data, also used by
# certificate-transparency-go and transparency-dev/merkle): eight leaves, roots for 1..8.
CT_DATA = [
    bytes.fromhex(h)
    for h in [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
]
CT_LEAVES = [leaf_hash(d) for d in CT_DATA]
CT_ROOTS = [
    bytes.fromhex(h)
    for h in [
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ]
]
CT_INCLUSION = {
    (0, 8): [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ],
    (5, 8): [
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ],
}
CT_CONSISTENCY = {
    (2, 8): [
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ],
    (6, 8): [
        "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ],
}

sizes = st.integers(min_value=1, max_value=300)


def leaves_of(size: int) -> list[bytes]:
    return [leaf_hash(i.to_bytes(4, "big")) for i in range(size)]


def flip(h: bytes, byte: int) -> bytes:
    return h[:byte] + bytes([h[byte] ^ 0x01]) + h[byte + 1 :]


def shape(index: int, size: int) -> tuple[str, ...]:
    """Which side each sibling is on, leaf first, from the MTH recursion itself."""
    if size == 1:
        return ()
    k = 1 << ((size - 1).bit_length() - 1)
    if index < k:
        return (*shape(index, k), "right")
    return (*shape(index - k, size - k), "left")


def test_hashing_primitives_follow_rfc_9162():
    assert EMPTY_ROOT == hashlib.sha256(b"").digest()
    assert leaf_hash(b"x") == hashlib.sha256(b"\x00x").digest()
    assert node_hash(b"l", b"r") == hashlib.sha256(b"\x01lr").digest()


def test_reference_roots_for_every_size():
    for size, expected in enumerate(CT_ROOTS):
        assert root(CT_LEAVES[:size]) == expected


def test_reference_inclusion_proofs():
    for (index, size), expected in CT_INCLUSION.items():
        proof = inclusion_proof(index, CT_LEAVES[:size])
        assert [h.hex() for h in proof] == expected
        assert verify_inclusion(index, size, CT_LEAVES[index], proof, CT_ROOTS[size])


def test_reference_consistency_proofs():
    for (old, size), expected in CT_CONSISTENCY.items():
        proof = consistency_proof(old, CT_LEAVES[:size])
        assert [h.hex() for h in proof] == expected
        assert verify_consistency(old, size, CT_ROOTS[old], CT_ROOTS[size], proof)


def test_past_sizes_are_answered_like_a_tree_of_that_size():
    tree = MerkleTree(leaves_of(100))
    for size in (1, 2, 3, 63, 64, 65, 99):
        prefix = MerkleTree(leaves_of(size))
        assert tree.root(size) == prefix.root()
        assert tree.inclusion_proof(size - 1, size) == prefix.inclusion_proof(size - 1)


@given(sizes, sizes)
def test_appending_in_batches_matches_building_at_once(first, second):
    tree = MerkleTree(leaves_of(first + second)[:first])
    tree.extend(leaves_of(first + second)[first:])
    assert tree.root() == root(leaves_of(first + second))


@given(sizes)
def test_every_inclusion_proof_verifies(size):
    leaves = leaves_of(size)
    tree = MerkleTree(leaves)
    top = tree.root()
    for index in range(size):
        assert verify_inclusion(index, size, leaves[index], tree.inclusion_proof(index), top)


@given(sizes)
def test_every_consistency_proof_verifies(size):
    tree = MerkleTree(leaves_of(size))
    for old in range(size + 1):
        proof = tree.consistency_proof(old)
        assert verify_consistency(old, size, tree.root(old), tree.root(), proof)


@given(sizes, st.data())
def test_altered_inclusion_proofs_fail(size, data):
    leaves = leaves_of(size)
    tree = MerkleTree(leaves)
    index = data.draw(st.integers(0, size - 1), label="index")
    proof, top = tree.inclusion_proof(index), tree.root()

    def verifies(i=index, n=size, leaf=leaves[index], path=proof, root_hash=top):
        return verify_inclusion(i, n, leaf, path, root_hash)

    assert verifies()
    if proof:
        at = data.draw(st.integers(0, len(proof) - 1), label="path element")
        byte = data.draw(st.integers(0, 31), label="byte")
        assert not verifies(path=[*proof[:at], flip(proof[at], byte), *proof[at + 1 :]])
        assert not verifies(path=proof[:-1])
    assert not verifies(path=[*proof, top])
    assert not verifies(leaf=flip(leaves[index], 0))
    assert not verifies(root_hash=flip(top, 31))
    assert not verifies(i=data.draw(st.integers(0, size).filter(lambda i: i != index)))
    # A size is authenticated by the signed tree head, not by the path: two sizes whose
    # trees put the leaf at the same place (same sibling sides) share a proof.
    other = data.draw(st.integers(1, 2 * size).filter(lambda n: n != size), label="size")
    same_place = index < other and shape(index, other) == shape(index, size)
    assert verifies(n=other) == same_place


@given(sizes, st.data())
def test_altered_consistency_proofs_fail(size, data):
    tree = MerkleTree(leaves_of(size + 1))
    new = size + 1
    old = data.draw(st.integers(1, size), label="old size")
    proof, old_root, new_root = tree.consistency_proof(old), tree.root(old), tree.root()

    def verifies(m=old, n=new, root_m=old_root, root_n=new_root, path=proof):
        return verify_consistency(m, n, root_m, root_n, path)

    assert verifies()
    at = data.draw(st.integers(0, len(proof) - 1), label="path element")
    byte = data.draw(st.integers(0, 31), label="byte")
    assert not verifies(path=[*proof[:at], flip(proof[at], byte), *proof[at + 1 :]])
    assert not verifies(path=proof[:-1])
    assert not verifies(path=[*proof, new_root])
    assert not verifies(root_m=flip(old_root, 0))
    assert not verifies(root_n=flip(new_root, 0))
    assert not verifies(m=new, n=old)


def test_degenerate_consistency_cases():
    assert verify_consistency(0, 8, EMPTY_ROOT, CT_ROOTS[8], [])
    assert not verify_consistency(0, 8, CT_ROOTS[1], CT_ROOTS[8], [])
    assert verify_consistency(8, 8, CT_ROOTS[8], CT_ROOTS[8], [])
    assert not verify_consistency(8, 8, CT_ROOTS[8], CT_ROOTS[7], [])
    assert not verify_consistency(8, 8, CT_ROOTS[8], CT_ROOTS[8], [CT_ROOTS[8]])
    assert not verify_consistency(6, 8, CT_ROOTS[6], CT_ROOTS[8], [])


def test_hashes_of_the_wrong_length_never_verify():
    proof = inclusion_proof(5, CT_LEAVES)
    assert not verify_inclusion(5, 8, CT_LEAVES[5], [proof[0][:31], *proof[1:]], CT_ROOTS[8])
    assert not verify_inclusion(5, 8, CT_LEAVES[5] + b"\x00", proof, CT_ROOTS[8])
    with pytest.raises(ValueError):
        MerkleTree([b"short"])


def test_out_of_range_requests_are_refused():
    tree = MerkleTree(CT_LEAVES)
    for bad in (
        lambda: tree.inclusion_proof(8),
        lambda: tree.inclusion_proof(-1),
        lambda: tree.root(9),
        lambda: tree.consistency_proof(5, 3),
    ):
        with pytest.raises(ValueError):
            bad()
    assert not verify_inclusion(8, 8, CT_LEAVES[0], [], CT_ROOTS[8])
