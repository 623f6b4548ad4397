"""Secrets that live in their own files, never in the database, and the private mode of every
file the CLI and the server create."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from model_gateway.storage.files import make_private_dirs

# Files the CLI and the server create (database, WAL, secrets) are the operator's alone.
PRIVATE_UMASK = 0o077


def restrict_file_modes() -> None:
    """Every file this process creates from now on is 0600, every folder 0700."""
    os.umask(PRIVATE_UMASK)


def load_or_create_secret(path: Path, nbytes: int = 32) -> bytes:
    """Read a hex secret from `path`, creating it (mode 0600, in folders created 0700) with
    random bytes if missing."""
    make_private_dirs(path.parent)
    try:
        # O_EXCL: two processes starting at once must not overwrite each other's secret.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(nbytes) + "\n")
    text = path.read_text().strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"secret file {path} does not hold a hex secret") from None
    if len(secret) < 16:
        raise ValueError(f"secret file {path} holds fewer than 16 bytes")
    return secret
