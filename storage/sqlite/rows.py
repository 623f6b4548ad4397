"""The SQLite backend's rows as records, and the compact forms it stores them in
(migration 0011: ids and digests as bytes, token counts in columns)."""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import time

import orjson

from model_gateway.storage._batch import pack as _pack
from model_gateway.storage.records import ReceiptRecord, UserRecord


def _json_list(value: list[str] | frozenset[str] | None) -> str | None:
    return None if value is None else orjson.dumps(sorted(value)).decode()


# `_pack(prefix, value)`: an id of the gateway's form (prefix + lowercase hex), or a hex
# digest (prefix ''), as the bytes of its hex part; anything else unchanged (migration
# 0011). In C (storage/_batch.c): a receipt packs 13 values, about 0.5 µs each in Python
# against 0.1; tests/storage/test_id_packing.py holds it to the Python definition.


def _unpack(prefix: str, value: str | bytes | None) -> str | None:
    return prefix + value.hex() if isinstance(value, bytes) else value


def _is_int64(value: object) -> bool:
    return type(value) is int and -(2**63) <= value < 2**63


_PRICE = "_price_per_mtok"


def _split_prices(usage: dict[str, int]) -> tuple[dict[str, int], str | None]:
    """The usage's counts, and the prices it was charged at as canonical JSON (None: no
    price), which receipt_shapes keeps once for every receipt charged at them (0018)."""
    if len(usage) <= 2:  # no price: a sandbox run's, or a receipt from before classes
        return usage, None
    prices = {k: v for k, v in usage.items() if k.endswith(_PRICE)}
    if not prices:
        return usage, None
    counts = {k: v for k, v in usage.items() if not k.endswith(_PRICE)}
    return counts, orjson.dumps(prices, option=orjson.OPT_SORT_KEYS).decode()


def _split_usage(usage: dict[str, int]) -> tuple[int | None, int | None, str | None]:
    """Input and output tokens as integers, any other count as JSON (None: no other)."""
    if len(usage) == 2:  # a chat's usage, every settlement: 0.4 µs against 1.4 below
        input_tokens, output_tokens = usage.get("input_tokens"), usage.get("output_tokens")
        if _is_int64(input_tokens) and _is_int64(output_tokens):
            return input_tokens, output_tokens, None
    rest = dict(usage)
    counts = [rest.pop(n) if _is_int64(rest.get(n)) else None for n in _TOKEN_COUNTS]
    return counts[0], counts[1], orjson.dumps(rest).decode() if rest else None


_TOKEN_COUNTS = ("input_tokens", "output_tokens")


def _usage_part(usage: str | None, part: str | None) -> int | str | None:
    """Migration 0011's `gateway_usage(usage, part)`: a token count, or (part NULL) the rest."""
    if usage is None:
        return None
    split = _split_usage(orjson.loads(usage))
    return split[2] if part is None else split[_TOKEN_COUNTS.index(part)]


def _response_commitment(salt: str | None, response_sha256: str | None) -> str | None:
    """SHA-256(salt || digest) from their hex: what every receipt the gateway issues
    commits to (gateway/proofs/commitments.py), so it is rebuilt rather than stored."""
    salt_bytes, digest = _pack("", salt), _pack("", response_sha256)
    if not isinstance(salt_bytes, bytes) or not isinstance(digest, bytes):
        return None
    return hashlib.sha256(salt_bytes + digest).hexdigest()


def _month_of(created_at_us: int) -> str:
    return _month_of_day(created_at_us // 86_400_000_000)


@functools.lru_cache(maxsize=4)
def _month_of_day(unix_day: int) -> str:
    return time.strftime("%Y-%m", time.gmtime(unix_day * 86_400))


def _receipt(row: sqlite3.Row) -> ReceiptRecord:
    """A row of the `receipts` view (migration 0011) as the record it was settled as."""
    fields = {name: row[name] for name in ReceiptRecord.__struct_fields__}
    fields["usage"] = orjson.loads(row["usage"])
    if fields["response_commitment"] is None and fields["response_salt"] is not None:
        fields["response_commitment"] = _response_commitment(
            fields["response_salt"], fields["response_sha256"]
        )
    return ReceiptRecord(**fields)


def _user(row: sqlite3.Row) -> UserRecord:
    return UserRecord(
        id=row["id"],
        email=row["email"],
        password_hash=row["password_hash"],
        role=row["role"],
        disabled=bool(row["disabled"]),
        created_at=row["created_at"],
    )
