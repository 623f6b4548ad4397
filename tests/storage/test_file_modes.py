"""Files the gateway creates are 0600 in a 0700 data folder (hardening decisions): the
database, its WAL and shared-memory files, the admin epoch file and the secrets."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from model_gateway.gateway.ops.secretfile import load_or_create_secret
from model_gateway.storage import ProjectRecord, open_storage
from model_gateway.storage.base import KeyRecord


@pytest.fixture
def usual_umask():
    """The usual umask (022), under which files are 0644 unless the code says otherwise."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def modes(*paths: Path) -> dict[str, str]:
    return {p.name: oct(mode(p)) for p in paths}


async def test_a_fresh_database_its_wal_shm_and_epoch_are_private(tmp_path, usual_umask):
    data = tmp_path / "deploy" / "data"
    db = data / "gateway.db"
    store = await open_storage(f"sqlite:///{db}")
    try:
        await store.create_project(ProjectRecord(id="prj_m", name="m"))
        await store.create_key(
            KeyRecord(
                id="key_m",
                prefix="proj_live_modes",
                key_hash=b"h",
                project_id="prj_m",
                scopes=frozenset({"inference"}),
            )
        )
        await store.revoke_key("proj_live_modes")  # writes the admin epoch file
        await store.add_credit("prj_m", 1, "2026-11")  # a write on the group-commit connection
        wal, shm = db.with_name("gateway.db-wal"), db.with_name("gateway.db-shm")
        epoch = db.with_name("gateway.db.epoch")
        for path in (db, wal, shm, epoch):
            assert path.exists(), path
        assert modes(db, wal, shm, epoch) == dict.fromkeys(
            ["gateway.db", "gateway.db-wal", "gateway.db-shm", "gateway.db.epoch"], "0o600"
        )
        assert oct(mode(data)) == "0o700"
        assert oct(mode(data.parent)) == "0o700"  # every folder the storage created
        leftovers = [p.name for p in data.iterdir() if p.name.endswith(".tmp")]
        assert leftovers == []
    finally:
        await store.close()


async def test_an_existing_folder_keeps_its_mode(tmp_path, usual_umask):
    """Only folders the storage creates are made 0700: never chmod an operator's folder."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    store = await open_storage(f"sqlite:///{shared / 'gateway.db'}")
    await store.close()
    assert oct(mode(shared)) == "0o755"
    assert oct(mode(shared / "gateway.db")) == "0o600"


async def test_a_database_created_readable_by_others_is_made_private_on_open(tmp_path, usual_umask):
    db = tmp_path / "old.db"
    sqlite3.connect(db).close()  # as an earlier version left it
    assert oct(mode(db)) == "0o644"
    store = await open_storage(f"sqlite:///{db}")
    try:
        await store.create_project(ProjectRecord(id="prj_o", name="o"))  # WAL and SHM
        wal, shm = db.with_name("old.db-wal"), db.with_name("old.db-shm")
        assert modes(db, wal, shm) == {
            "old.db": "0o600",
            "old.db-wal": "0o600",
            "old.db-shm": "0o600",
        }
    finally:
        await store.close()


def test_secrets_are_private_in_a_private_folder(tmp_path, usual_umask):
    secret = tmp_path / "deploy" / "data" / "key-pepper"
    load_or_create_secret(secret)
    assert oct(mode(secret)) == "0o600"
    assert oct(mode(secret.parent)) == "0o700"
    assert oct(mode(secret.parent.parent)) == "0o700"
