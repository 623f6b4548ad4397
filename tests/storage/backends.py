"""The storage backends every storage test runs on, in one place (as the `limits` package
does in its tests/utils.py): a test takes the `storage_url` fixture (tests/conftest.py) and
runs once per backend. A backend that needs a server is marked; its cases skip only when
no server listens, and fail instead when CI=true, so CI never passes without them."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import pytest

# A server and a role that may create databases; each test run makes a database of its own.
POSTGRES_ADMIN_URL = os.environ.get(
    "GATEWAY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

STORAGE_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def postgres_absent() -> str | None:
    """Why the PostgreSQL cases cannot run here, or None when a server listens."""
    parts = urlsplit(POSTGRES_ADMIN_URL)
    where = f"{parts.hostname or '127.0.0.1'}:{parts.port or 5432}"
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5432), 1):
            return None
    except OSError as exc:
        return (
            f"no PostgreSQL server listens at {where} ({exc.strerror or exc});"
            " set GATEWAY_TEST_POSTGRES_URL"
        )


def _admin(sql: str) -> None:
    """Run one admin statement on a loop of its own, in a thread: the tests' loops stay
    untouched whatever runs this (a sync fixture, a hook)."""
    import asyncpg  # type: ignore[import-untyped]

    async def run() -> None:
        conn = await asyncpg.connect(POSTGRES_ADMIN_URL)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    failure: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


@contextmanager
def postgres_database() -> Iterator[str]:
    """A new database with a random name; dropped (its connections cut) at the end."""
    name = f"gateway_test_{secrets.token_hex(6)}"
    _admin(f'CREATE DATABASE "{name}"')
    parts = urlsplit(POSTGRES_ADMIN_URL)
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
