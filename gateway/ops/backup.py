"""`gateway backup DIR` and `gateway restore DIR`: the database and the secrets it needs.

The backup is taken with SQLite's online backup API from a read-only connection: one
consistent snapshot while the gateway keeps serving (WAL readers never block writers).
The secrets go with it, because keys (pepper) and receipts (signing key) cannot be
checked without them: keep backups as private as the data folder. Holds open at the
time of the backup come back as holds of a dead process, released at the next start.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import orjson

from model_gateway.gateway.config import Config, ConfigError, load_config

DATABASE = "gateway.db"


# The CLI's parser class: its subparsers and their parents are of that class.
_Parser = TypeVar("_Parser", bound=argparse.ArgumentParser)


class BackupError(Exception):
    pass


def add_parsers(commands: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    p = commands.add_parser("backup", parents=[common], help="back up the database and secrets")
    p.add_argument("directory", help="a new or empty folder")
    p.set_defaults(standalone=lambda args: _run(args, backup))
    p = commands.add_parser("restore", parents=[common], help="restore a backup (gateway stopped)")
    p.add_argument("directory", help="a folder made by `gateway backup`")
    p.set_defaults(standalone=lambda args: _run(args, restore))


def _run(args: argparse.Namespace, action: Callable[[Config, Path], dict[str, object]]) -> int:
    try:
        record = action(load_config(args.config), Path(args.directory))
    except (ConfigError, BackupError, OSError, sqlite3.Error) as exc:
        if args.json:
            error = {"type": "invalid_request", "message": str(exc)}
            sys.stdout.write(orjson.dumps({"error": error}).decode() + "\n")
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(record).decode() + "\n")
    else:
        print("\n".join(f"{name}: {value}" for name, value in record.items()))
    return 0


def _database(config: Config) -> Path:
    url = config.storage_url
    if not url.startswith("sqlite:///"):
        raise BackupError("backup covers SQLite; back up PostgreSQL with pg_dump")
    return Path(url[len("sqlite:///") :])


def _secrets(config: Config) -> dict[str, Path]:
    files = {
        "key-pepper": config.path(config.secrets.key_pepper_file),
        "signing-key": config.path(config.secrets.signing_key_file),
    }
    if config.sandbox_node is not None:
        files["sandbox-secret"] = config.path(config.sandbox_node.secret_file)
    return files


def _private_copy(source: Path, target: Path) -> None:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, source.open("rb") as data:
        shutil.copyfileobj(data, out)


def backup(config: Config, directory: Path) -> dict[str, object]:
    database = _database(config)
    if not database.exists():
        raise BackupError(f"no database at {database}")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if any(directory.iterdir()):
        raise BackupError(f"{directory} is not empty")
    started = time.monotonic()
    target = directory / DATABASE
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    source = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        with sqlite3.connect(target) as copy:
            source.backup(copy)  # one step: a consistent snapshot
        copy.close()
    finally:
        source.close()
    saved = [name for name, path in _secrets(config).items() if path.exists()]
    for name in saved:
        _private_copy(_secrets(config)[name], directory / name)
    return {
        "directory": str(directory),
        "database_bytes": target.stat().st_size,
        "secrets": saved,
        "seconds": round(time.monotonic() - started, 3),
    }


def restore(config: Config, directory: Path) -> dict[str, object]:
    """Into a data folder without a database: move the old one aside first, never overwrite."""
    database = _database(config)
    if not (directory / DATABASE).exists():
        raise BackupError(f"{directory} holds no {DATABASE}")
    secrets = _secrets(config)
    present = [p for p in (database, *secrets.values()) if p.exists()]
    present += [Path(f"{database}{suffix}") for suffix in ("-wal", "-shm")]
    present = [p for p in present if p.exists()]
    if present:
        raise BackupError(f"move these aside first (restore never overwrites): {present[0]}")
    database.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _private_copy(directory / DATABASE, database)
    restored = []
    for name, path in secrets.items():
        if (directory / name).exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _private_copy(directory / name, path)
            restored.append(name)
    return {"database": str(database), "secrets": restored}
