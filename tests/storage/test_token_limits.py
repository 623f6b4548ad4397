"""Tokens per minute on projects and keys (migrations 0017), on every backend: stored,
read, changed and cleared like rpm; a change of it is an admin change (keys' caches carry
it); a stored tpm is positive."""

from __future__ import annotations

import itertools
import time

import pytest

from model_gateway.storage import ProjectRecord, StorageError, open_storage
from model_gateway.storage.base import KeyRecord

_ids = itertools.count()


@pytest.fixture
async def storage(storage_url):
    backend = await open_storage(storage_url)
    yield backend
    await backend.close()


def _unique() -> str:
    return f"{time.time_ns() % 10**8:08d}{next(_ids)}"[-8:]


async def project_and_key(storage, *, project_tpm=None, key_tpm=None) -> tuple[str, str]:
    unique = _unique()
    pid, prefix = f"prj_tpm_{unique}", f"proj_live_{unique}"
    await storage.create_project(ProjectRecord(id=pid, name="t", rpm=5, tpm=project_tpm))
    await storage.create_key(
        KeyRecord(
            id=f"key_{unique}",
            prefix=prefix,
            key_hash=b"h",
            project_id=pid,
            scopes=frozenset({"inference"}),
            rpm=3,
            tpm=key_tpm,
        )
    )
    return pid, prefix


async def test_tpm_is_stored_read_listed_changed_and_cleared(storage):
    pid, prefix = await project_and_key(storage, project_tpm=90_000, key_tpm=2**31 - 1)
    assert (await storage.get_project(pid)).tpm == 90_000
    assert (await storage.get_key(prefix)).tpm == 2**31 - 1
    assert [p.tpm for p in await storage.list_projects({pid})] == [90_000]
    assert [k.key.tpm for k in await storage.list_keys(pid)] == [2**31 - 1]
    changed = await storage.update_project(pid, {"tpm": 7})
    assert (changed.tpm, changed.rpm) == (7, 5)  # the rest unchanged
    assert (await storage.update_key(prefix, {"tpm": 9})).tpm == 9
    assert (await storage.update_project(pid, {"tpm": None})).tpm is None
    assert (await storage.update_key(prefix, {"tpm": None})).tpm is None
    assert (await storage.get_key(prefix)).rpm == 3


async def test_unset_tpm_is_none(storage):
    pid, prefix = await project_and_key(storage)
    assert (await storage.get_project(pid)).tpm is None
    assert (await storage.get_key(prefix)).tpm is None


async def test_a_tpm_change_is_an_admin_change(storage):
    pid, prefix = await project_and_key(storage)
    before = await storage.admin_change()
    epoch = storage.admin_epoch()
    await storage.update_key(prefix, {"tpm": 1_000})
    after_key = await storage.admin_change()
    assert after_key > before
    await storage.update_project(pid, {"tpm": 2_000})
    assert await storage.admin_change() > after_key
    assert storage.admin_epoch() != epoch  # this process's caches drop at once


async def test_a_stored_tpm_is_positive(storage):
    pid, prefix = await project_and_key(storage)
    for bad in (0, -5):
        with pytest.raises(StorageError):
            await storage.update_project(pid, {"tpm": bad})
        with pytest.raises(StorageError):
            await storage.update_key(prefix, {"tpm": bad})
