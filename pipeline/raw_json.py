"""Checks on a request body's raw JSON that msgspec cannot make with a path: its nesting
depth, its UTF-8, and integers wider than 64 bits.

msgspec raises RecursionError on a body nested thousands deep and UnicodeDecodeError on
a string that is not UTF-8, neither with a position; and a body deep enough to pass it
still breaks later (orjson refuses to encode past 254 levels when the request goes
upstream). msgspec reads an integer of any width, which orjson then cannot write (the
body sent upstream, the Responses object that repeats the request's `text` and `tools`).
All are the client's fault: 400 invalid_request, with the path of the field where the
body went wrong, found by a scan that only runs once the body is known bad.
"""

from __future__ import annotations

import re
from itertools import accumulate

from model_gateway.pipeline.errors import InvalidRequest

MAX_DEPTH = 64  # decisions.md: a body nested deeper is invalid_request

# A string literal, as "unrolled loop" (runs of plain bytes at once: ~3x faster on long
# strings than one alternation per byte).
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*+"|[\[\]{}:,]', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# The depth step of each bracket, for accumulate().
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
# 19 digits in a row: the only integers that may not fit in 64 bits (2^63 has 19).
_LONG_DIGITS = re.compile(rb"\d{19}")
# A string, or a number: its integer part, then its fraction and exponent if any.
_STRING_OR_NUMBER = re.compile(
    rb'"(?:[^"\\]|\\.)*+"|(-?\d+)((?:\.\d+)?(?:[eE][+-]?\d+)?)', re.DOTALL
)
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1  # what orjson writes


def too_deep(body: bytes) -> bool:
    """Whether the body nests objects and arrays deeper than MAX_DEPTH (strings ignored)."""
    if len(body.translate(None, _NOT_BRACKETS)) <= MAX_DEPTH:
        return False  # the usual case: too few brackets, strings' included, to be that deep
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) <= MAX_DEPTH:
        return False
    return max(accumulate(map(_STEP.__getitem__, brackets))) > MAX_DEPTH


class _Scanner:
    """Follows the path of the value being read, token by token (the body is only
    scanned this way once it is known to be bad, to name where)."""

    def __init__(self) -> None:
        # One frame per open container: [label, expecting a key]; an array's label is
        # its member's index, an object's the member's key (None before the first key).
        self.frames: list[list[object]] = []

    def path(self, frames: list[list[object]] | None = None) -> str | None:
        labels = [str(label) for label, _ in (self.frames if frames is None else frames)]
        return ".".join(label for label in labels if label != "None") or None

    def feed(self, token: bytes) -> None:
        top = self.frames[-1] if self.frames else None
        if token == b"{":
            self.frames.append([None, True])
        elif token == b"[":
            self.frames.append([0, False])
        elif token in (b"}", b"]"):
            if self.frames:
                self.frames.pop()
        elif token == b"," and top is not None:
            if isinstance(top[0], int):
                top[0] += 1
            else:
                top[1] = True
        elif token.startswith(b'"') and top is not None and top[1]:
            top[0], top[1] = token[1:-1].decode("utf-8", "replace"), False


def path_of_depth(body: bytes, depth: int) -> str | None:
    """The path of the first container opened at `depth` (the outermost being 1)."""
    scanner = _Scanner()
    for token in _TOKEN.finditer(body):
        scanner.feed(token.group())
        if len(scanner.frames) >= depth:
            return scanner.path(scanner.frames[:-1])
    return None


def path_at(body: bytes, offset: int) -> str | None:
    """The path of the member whose key or value holds the byte at `offset` (a number is
    no token: its member is the one read up to it)."""
    scanner = _Scanner()
    for token in _TOKEN.finditer(body):
        if token.start() > offset:
            break
        scanner.feed(token.group())  # a key names itself; a value its member's key
        if token.end() > offset:
            break
    return scanner.path()


def too_deep_error(body: bytes) -> InvalidRequest:
    param = path_of_depth(body, MAX_DEPTH + 1)
    return InvalidRequest(
        f"The request body is nested deeper than {MAX_DEPTH} levels.", param=param
    )


def not_utf8_error(body: bytes) -> InvalidRequest:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = exc.start
    else:
        bad = len(body)
    param = path_at(body, bad)
    return InvalidRequest("The request body is not valid UTF-8.", param=param)


def too_wide_offset(body: bytes) -> int | None:
    """Where the first integer outside [-2^63, 2^64 - 1] starts, or None (the usual case,
    no run of 19 digits anywhere, costs one search)."""
    if _LONG_DIGITS.search(body) is None:
        return None
    for token in _STRING_OR_NUMBER.finditer(body):
        digits, rest = token.group(1), token.group(2)
        if digits is not None and not rest and not _INT64_MIN <= int(digits) <= _UINT64_MAX:
            return token.start()
    return None


def too_wide_error(body: bytes, offset: int) -> InvalidRequest:
    return InvalidRequest(
        "The request body holds an integer wider than 64 bits.", param=path_at(body, offset)
    )
