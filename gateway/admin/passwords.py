"""Console users' passwords: argon2id (argon2-cffi), imported on first use so that the server's
start-up and idle memory do not carry it. Hashing runs off the event loop."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from argon2 import PasswordHasher

MIN_LENGTH = 10


@functools.cache
def _hasher() -> PasswordHasher:
    from argon2 import PasswordHasher  # lazy: only a sign-in or `users create` needs it

    return PasswordHasher()  # argon2id, the library's current recommended parameters


def hash_password(password: str) -> str:
    if len(password) < MIN_LENGTH:
        raise ValueError(f"a password needs at least {MIN_LENGTH} characters")
    return _hasher().hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    from argon2.exceptions import InvalidHashError, VerificationError

    try:
        return _hasher().verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


@functools.cache
def _decoy_hash() -> str:
    return _hasher().hash("an unknown email costs the same as a wrong password")


async def check_password(password_hash: str | None, password: str) -> bool:
    """Verify in a worker thread; an unknown user (None) verifies against a decoy, so both
    take the same time and give the same answer."""
    return (
        await asyncio.to_thread(verify_password, password_hash or _decoy_hash(), password)
        and password_hash is not None
    )
