"""Files of a deployment that only its own user may read: 0600 files in 0700 folders."""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def make_private_dirs(folder: Path) -> None:
    """Create `folder` and its missing parents, each 0700. Folders that already exist keep
    their mode: the operator's own (a home, /var/lib) are never changed."""
    missing: list[Path] = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for created in reversed(missing):
        try:
            created.mkdir(mode=PRIVATE_FOLDER)
        except FileExistsError:  # another process made it meanwhile
            continue
        # mkdir's mode passes through the umask; a umask that drops owner bits would
        # leave a folder we cannot use.
        os.chmod(created, PRIVATE_FOLDER)


def make_private(path: Path) -> None:
    """Create `path` empty with mode 0600 if it is missing; take the group's and others'
    permissions away from an existing one (a file an earlier version left 0644)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:
            os.fchmod(fd, mode & PRIVATE_FILE)
    finally:
        os.close(fd)


def restrict_if_present(path: Path) -> None:
    """Take the group's and others' permissions away from `path` if it exists."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    if mode & 0o077:
        os.chmod(path, mode & PRIVATE_FILE)


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to a new or truncated file `path` with mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(fd, PRIVATE_FILE)  # it may have existed (a crash between write and rename)
        out.write(data)
