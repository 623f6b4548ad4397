"""The Redis the tests use (a server of the machine, as for PostgreSQL): its cases skip only
when none listens, and fail instead when CI=true. Tests never share keys: each takes a key
prefix of its own."""

from __future__ import annotations

import os
import secrets
import socket
from urllib.parse import urlsplit

REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_absent() -> str | None:
    """Why the Redis cases cannot run here, or None when a server listens."""
    parts = urlsplit(REDIS_URL)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    try:
        with socket.create_connection((host, port), 1):
            return None
    except OSError as exc:
        why = exc.strerror or exc
        return f"no Redis server listens at {host}:{port} ({why}); set GATEWAY_TEST_REDIS_URL"


def new_prefix() -> str:
    return f"gateway-test:{secrets.token_hex(6)}:"


def delete_prefix(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
