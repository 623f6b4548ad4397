"""Rows of the PostgreSQL backend as records, where several domain modules read them."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from model_gateway.storage.postgres.connection import Row
from model_gateway.storage.records import ReceiptRecord, UserRecord


def _fields(row: Row, record: type[msgspec.Struct]) -> dict[str, Any]:
    """The row's columns that are fields of the record (tables may hold more)."""
    return {name: row[name] for name in record.__struct_fields__}


def _receipt(row: Row) -> ReceiptRecord:
    return ReceiptRecord(**{**_fields(row, ReceiptRecord), "usage": orjson.loads(row["usage"])})


def _user(row: Row) -> UserRecord:
    return UserRecord(
        id=row["id"],
        email=row["email"],
        password_hash=row["password_hash"],
        role=row["role"],
        disabled=bool(row["disabled"]),
        created_at=row["created_at"],
    )
