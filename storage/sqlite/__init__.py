"""The embedded backend: one SQLite file in WAL mode.

One gateway process per database file: several processes may read and administer it
(the CLI does), but the metering counters assume a single serving process. Use the
PostgreSQL backend for several gateway instances.

A module per domain, each a class over the shared connections (connection.py, which also
states which connection writes what); `SQLiteStorage` is their union.
"""

from __future__ import annotations

from model_gateway.storage._batch import pack as _pack
from model_gateway.storage.sqlite.accounts import SQLiteAccounts
from model_gateway.storage.sqlite.agents import SQLiteAgents
from model_gateway.storage.sqlite.cluster import SQLiteCluster
from model_gateway.storage.sqlite.connection import (
    BUSY_TIMEOUT_S,
    CACHE_SIZE_KIB,
    MMAP_SIZE_BYTES,
    PAGE_SIZE_BYTES,
    AdminEpoch,
    _migrations,
    _pragmas,
    _read_unless_busy,
)
from model_gateway.storage.sqlite.console import SQLiteConsole
from model_gateway.storage.sqlite.ledger import SQLiteLedger
from model_gateway.storage.sqlite.log import SQLiteLog
from model_gateway.storage.sqlite.rows import (
    _receipt,
    _response_commitment,
    _split_usage,
    _unpack,
    _usage_part,
)


class SQLiteStorage(
    SQLiteAccounts, SQLiteLedger, SQLiteLog, SQLiteConsole, SQLiteAgents, SQLiteCluster
):
    """Reads (but the log's and the lease meter's small ones) and read-then-decide admin
    transactions through aiosqlite; every other write through the group-commit writer (the
    rules in connection.py)."""


# What tests and benchmarks reach for by name (constants they read, converters they check).
__all__ = [
    "BUSY_TIMEOUT_S",
    "CACHE_SIZE_KIB",
    "MMAP_SIZE_BYTES",
    "PAGE_SIZE_BYTES",
    "AdminEpoch",
    "SQLiteStorage",
    "_migrations",
    "_pack",
    "_pragmas",
    "_read_unless_busy",
    "_receipt",
    "_response_commitment",
    "_split_usage",
    "_unpack",
    "_usage_part",
]
