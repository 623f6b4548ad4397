"""A small transparency-log client that knows only the published formats: C2SP
signed-note and tlog-checkpoint, C2SP tlog-tiles and RFC 6962/9162 hashing. It imports
nothing from the gateway, so it checks what a monitor written against the specs (in Go,
say) would see, not what our own code believes.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

WIDTH = 256


class Invalid(Exception):
    pass


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def leaf(entry: bytes) -> bytes:
    return sha256(b"\x00" + entry)


def node(left: bytes, right: bytes) -> bytes:
    return sha256(b"\x01" + left + right)


@dataclass(frozen=True)
class Verifier:
    name: str
    key_id: bytes
    public_key: bytes


def parse_vkey(vkey: str) -> Verifier:
    """`<name>+<8 hex key id>+<base64(0x01 || Ed25519 key)>` (golang.org/x/mod/sumdb/note)."""
    name, key_hash, encoded = vkey.split("+", 2)  # base64 may hold "+" too
    raw = base64.b64decode(encoded, validate=True)
    if raw[:1] != b"\x01" or len(raw) != 33:
        raise Invalid("not an Ed25519 verifier key")
    key_id = sha256(name.encode() + b"\n" + raw)[:4]
    if key_id.hex() != key_hash:
        raise Invalid("the verifier key's hash does not match its name and key")
    return Verifier(name, key_id, raw[1:])


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes


def open_note(note: str, verifier: Verifier) -> Checkpoint:
    """The checkpoint of a signed note, if `verifier` signed it (c2sp.org/signed-note)."""
    text, sep, signatures = note.rpartition("\n\n")
    if not sep:
        raise Invalid("no blank line before the signatures")
    text += "\n"
    verified = False
    for line in signatures.splitlines():
        dash, name, sig64 = line.split(" ")
        if dash != "\u2014":
            raise Invalid("malformed signature line")
        sig = base64.b64decode(sig64, validate=True)
        if name != verifier.name or sig[:4] != verifier.key_id:
            continue
        try:
            Ed25519PublicKey.from_public_bytes(verifier.public_key).verify(sig[4:], text.encode())
        except InvalidSignature:
            raise Invalid("the log's signature does not verify") from None
        verified = True
    if not verified:
        raise Invalid("not signed by the log's key")
    origin, size, root, *_ = text.split("\n")
    if origin != verifier.name:
        raise Invalid("the origin is not the log's")
    return Checkpoint(origin, int(size), base64.b64decode(root, validate=True))


def index_path(n: int) -> str:
    parts = [f"{n % 1000:03d}"]
    while n >= 1000:
        n //= 1000
        parts.insert(0, f"x{n % 1000:03d}")
    return "/".join(parts)


class Log:
    """Reads a tiled log at `prefix` (e.g. http://host/api/proofs/log)."""

    def __init__(self, http: httpx.Client, prefix: str, verifier: Verifier) -> None:
        self.http, self.prefix, self.verifier = http, prefix, verifier
        self.fetched: dict[str, httpx.Response] = {}

    def get(self, path: str) -> httpx.Response:
        if path not in self.fetched:
            response = self.http.get(f"{self.prefix}/{path}")
            if response.status_code != 200:
                raise Invalid(f"{path}: HTTP {response.status_code}")
            self.fetched[path] = response
        return self.fetched[path]

    def checkpoint(self) -> Checkpoint:
        return open_note(self.get_fresh("checkpoint").text, self.verifier)

    def get_fresh(self, path: str) -> httpx.Response:
        self.fetched.pop(path, None)
        return self.get(path)

    def _width(self, level: int, n: int, size: int) -> int:
        return min(WIDTH, (size // WIDTH**level) - n * WIDTH)

    def tile(self, level: int | str, n: int, size: int) -> bytes:
        """The tile as a tree of `size` has it: full, or the partial `.p/<W>` that size names."""
        width = self._width(0 if level == "entries" else level, n, size)
        if width <= 0:
            raise Invalid(f"a tree of {size} has no tile {level}/{n}")
        path = f"tile/{level}/{index_path(n)}" + ("" if width == WIDTH else f".p/{width}")
        return self.get(path).content

    def entries(self, n: int, size: int) -> list[bytes]:
        bundle, entries = self.tile("entries", n, size), []
        while bundle:
            length = int.from_bytes(bundle[:2], "big")
            entries.append(bundle[2 : 2 + length])
            bundle = bundle[2 + length :]
        return entries

    # -- hashes of the tree, from tiles (the way sumdb's tlog.StoredHash finds them)

    def perfect(self, height: int, index: int, size: int) -> bytes:
        """MTH of leaves [index * 2**height, (index + 1) * 2**height)."""
        if height % 8:
            return node(
                self.perfect(height - 1, 2 * index, size),
                self.perfect(height - 1, 2 * index + 1, size),
            )
        level = height // 8
        tile = self.tile(level, index // WIDTH, size)
        at = (index % WIDTH) * 32
        if len(tile) < at + 32:
            raise Invalid("a tile is shorter than its path says")
        return tile[at : at + 32]

    def mth(self, lo: int, hi: int, size: int) -> bytes:
        n = hi - lo
        if n == 0:
            return sha256(b"")
        if n & (n - 1) == 0 and lo % n == 0:
            return self.perfect(n.bit_length() - 1, lo // n, size)
        k = 1 << ((n - 1).bit_length() - 1)
        return node(self.mth(lo, lo + k, size), self.mth(lo + k, hi, size))

    def inclusion(self, m: int, size: int) -> list[bytes]:
        """RFC 9162 2.1.3.1 PATH(m, D[0:size])."""

        def path(m: int, lo: int, hi: int) -> list[bytes]:
            if hi - lo == 1:
                return []
            k = 1 << ((hi - lo - 1).bit_length() - 1)
            if m < k:
                return [*path(m, lo, lo + k), self.mth(lo + k, hi, size)]
            return [*path(m - k, lo + k, hi), self.mth(lo, lo + k, size)]

        return path(m, 0, size)

    def consistency(self, m: int, size: int) -> list[bytes]:
        """RFC 9162 2.1.4.1 PROOF(m, D[0:size])."""

        def subproof(m: int, lo: int, hi: int, b: bool) -> list[bytes]:
            if m == hi - lo:
                return [] if b else [self.mth(lo, hi, size)]
            k = 1 << ((hi - lo - 1).bit_length() - 1)
            if m <= k:
                return [*subproof(m, lo, lo + k, b), self.mth(lo + k, hi, size)]
            return [*subproof(m - k, lo + k, hi, False), self.mth(lo, lo + k, size)]

        return subproof(m, 0, size, True)


def verify_inclusion(index: int, size: int, leaf_hash: bytes, proof, root: bytes) -> bool:
    """RFC 9162 2.1.3.2."""
    if index >= size:
        return False
    fn, sn, r = index, size - 1, leaf_hash
    for p in proof:
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            r = node(p, r)
            while fn % 2 == 0 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(first: int, second: int, first_root, second_root, proof) -> bool:
    """RFC 9162 2.1.4.2 (0 < first < second)."""
    if not 0 < first < second or not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn % 2 == 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            fr, sr = node(c, fr), node(c, sr)
            while fn % 2 == 0 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == first_root and sr == second_root
