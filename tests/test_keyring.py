"""The key cache and revocation: a lookup that read a key before its revocation must not
store it after the revocation emptied the cache (hardening item 8)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from model_gateway.gateway.access.keyring import KeyRing
from model_gateway.pipeline.errors import InvalidApiKey
from model_gateway.storage.sqlite import SQLiteStorage
from tests.support.records import add_key, add_project


class ProjectReadsWaitForAGate(SQLiteStorage):
    """The real SQLite storage, with a delay injected between a key's read and its
    project's read: the window in which a revocation can land."""

    gate: asyncio.Event | None = None  # the next project read waits for it, once

    async def get_project(self, project_id):
        gate, self.gate = self.gate, None
        if gate is not None:
            await gate.wait()
        return await super().get_project(project_id)


@pytest.fixture
async def storage(tmp_path):
    storage = await ProjectReadsWaitForAGate.open(f"sqlite:///{tmp_path}/gateway.db")
    yield storage
    await storage.close()


async def test_a_lookup_that_straddles_a_revocation_does_not_cache_the_key(storage):
    pepper = secrets.token_bytes(32)
    project = await add_project(storage)
    key, record = await add_key(storage, pepper, project.id)
    keyring = KeyRing(storage, pepper)

    gate = storage.gate = asyncio.Event()
    before = asyncio.create_task(keyring.authenticate(key))  # reads the key, then waits
    await asyncio.sleep(0.05)
    await storage.revoke_key(record.prefix)
    with pytest.raises(InvalidApiKey):
        await keyring.authenticate(key)  # a request after the revocation: refused
    gate.set()
    await before  # it read the key before the revocation: this one answer may still pass

    with pytest.raises(InvalidApiKey):
        await keyring.authenticate(key)  # the very next request is refused


async def test_a_lookup_without_a_change_meanwhile_is_cached(storage):
    pepper = secrets.token_bytes(32)
    project = await add_project(storage)
    key, _ = await add_key(storage, pepper, project.id)
    keyring = KeyRing(storage, pepper)
    await keyring.authenticate(key)
    storage.gate = asyncio.Event()  # a lookup that read storage now would wait forever
    found, _ = await asyncio.wait_for(keyring.authenticate(key), timeout=1)
    assert found.prefix == key[:18]
