"""The shared backend: PostgreSQL through an asyncpg pool, for any number of gateway processes.

A module per domain, each a class over the shared pool (connection.py: its life cycle, and
where driver errors get their meaning); `PostgresStorage` is their union.
"""

from __future__ import annotations

from model_gateway.storage.postgres.accounts import PostgresAccounts
from model_gateway.storage.postgres.agents import PostgresAgents
from model_gateway.storage.postgres.cluster import PostgresCluster
from model_gateway.storage.postgres.connection import _migrations
from model_gateway.storage.postgres.console import PostgresConsole
from model_gateway.storage.postgres.ledger import PostgresLedger
from model_gateway.storage.postgres.log import PostgresLog


class PostgresStorage(
    PostgresAccounts, PostgresLedger, PostgresLog, PostgresConsole, PostgresAgents, PostgresCluster
):
    """Every public method is one short autocommit statement (or one transaction) on a
    pooled connection, through `_run`, which reruns transient failures. Driver errors
    become StorageErrors once, in `translate_error`, called by the Storage base class."""


__all__ = ["PostgresStorage", "_migrations"]
