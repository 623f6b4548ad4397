"""One suite for every storage backend, chosen by URL. A backend that needs a server is
marked, and skipped only when that server is truly absent (nothing listens), never in CI."""

from __future__ import annotations

import secrets

import pytest

from model_gateway.storage import open_storage
from model_gateway.storage.base import (
    KeyRecord,
    ProjectRecord,
    RecordNotFound,
    StateConflict,
    StorageError,
    new_id,
    now_s,
)


@pytest.fixture
def url(storage_url) -> str:
    """Each backend in turn (tests/storage/backends.py); tests use fresh ids, so they never
    assume an empty database."""
    return storage_url


@pytest.fixture
async def storage(url):
    store = await open_storage(url)
    yield store
    await store.close()


def project(**fields) -> ProjectRecord:
    return ProjectRecord(id=new_id("prj"), name="conformance", created_at=now_s(), **fields)


def key(project_id: str, **fields) -> KeyRecord:
    fields = {
        "prefix": "proj_live_" + secrets.token_hex(4),
        "scopes": frozenset({"inference"}),
        **fields,
    }
    return KeyRecord(
        id=new_id("key"),
        key_hash=secrets.token_bytes(32),
        project_id=project_id,
        created_at=now_s(),
        **fields,
    )


async def test_a_fresh_database_answers_health(storage):
    await storage.health()


async def test_a_project_round_trips_with_every_field(storage):
    full = project(
        monthly_budget=25_000_000,
        rpm=60,
        allow_models=["echo-1", "echo-2"],
        exclude_models=["echo-off"],
    )
    await storage.create_project(full)
    assert await storage.get_project(full.id) == full
    bare = project()
    await storage.create_project(bare)
    got = await storage.get_project(bare.id)
    assert got == bare
    assert got.state == "active" and got.allow_models is None and got.exclude_models == []


async def test_an_unknown_project_is_none(storage):
    assert await storage.get_project("prj_does_not_exist") is None


async def test_archive_then_archive_again_is_a_state_conflict(storage):
    p = await storage.create_project(project())
    archived = await storage.archive_project(p.id)
    assert archived.state == "archived" and archived.id == p.id
    assert (await storage.get_project(p.id)).state == "archived"
    with pytest.raises(StateConflict):
        await storage.archive_project(p.id)
    assert (await storage.get_project(p.id)).state == "archived"


async def test_archiving_an_unknown_project_is_record_not_found(storage):
    with pytest.raises(RecordNotFound):
        await storage.archive_project("prj_does_not_exist")


async def test_a_key_round_trips_by_prefix_with_every_field(storage):
    p = await storage.create_project(project())
    full = key(
        p.id,
        scopes=frozenset({"inference", "receipts", "agents"}),
        models=["echo-1"],
        monthly_limit=5_000_000,
        expires_at=now_s() + 3600,
        rpm=10,
    )
    await storage.create_key(full)
    got = await storage.get_key(full.prefix)
    assert got == full
    assert isinstance(got.scopes, frozenset) and isinstance(got.key_hash, bytes)
    bare = key(p.id)
    await storage.create_key(bare)
    got = await storage.get_key(bare.prefix)
    assert got == bare
    assert got.state == "usable" and got.models is None and got.expires_at is None


async def test_a_key_for_an_unknown_project_is_record_not_found(storage):
    orphan = key("prj_does_not_exist")
    with pytest.raises(RecordNotFound):
        await storage.create_key(orphan)
    assert await storage.get_key(orphan.prefix) is None


async def test_a_second_key_with_the_same_prefix_is_refused(storage):
    p = await storage.create_project(project())
    first = await storage.create_key(key(p.id))
    twin = key(p.id, prefix=first.prefix)
    with pytest.raises(StorageError):
        await storage.create_key(twin)
    assert (await storage.get_key(first.prefix)).id == first.id


async def test_an_unknown_prefix_is_none(storage):
    assert await storage.get_key("proj_live_nothere0") is None


async def test_revoke_then_revoke_again_is_a_state_conflict(storage):
    p = await storage.create_project(project())
    k = await storage.create_key(key(p.id))
    other = await storage.create_key(key(p.id))
    revoked = await storage.revoke_key(k.prefix)
    assert revoked.state == "revoked" and revoked.id == k.id
    assert (await storage.get_key(k.prefix)).state == "revoked"
    assert (await storage.get_key(other.prefix)).state == "usable"  # only that key
    with pytest.raises(StateConflict):
        await storage.revoke_key(k.prefix)


async def test_revoking_an_unknown_prefix_is_record_not_found(storage):
    with pytest.raises(RecordNotFound):
        await storage.revoke_key("proj_live_nothere0")


async def test_the_admin_epoch_moves_after_revoke_and_archive_seen_by_other_handles(storage, url):
    other = await open_storage(url)  # as another process (the CLI) would
    try:
        p = await storage.create_project(project())
        k = await storage.create_key(key(p.id))
        start, start_other = storage.admin_epoch(), other.admin_epoch()
        await storage.get_key(k.prefix)
        await storage.get_project(p.id)
        assert storage.admin_epoch() == start  # reading changes nothing

        await other.revoke_key(k.prefix)
        after_revoke = storage.admin_epoch()
        assert after_revoke != start
        assert other.admin_epoch() != start_other

        await other.archive_project(p.id)
        assert storage.admin_epoch() not in (start, after_revoke)
    finally:
        await other.close()


async def test_the_epoch_moves_even_for_changes_made_in_quick_succession(storage):
    p = await storage.create_project(project())
    keys = [await storage.create_key(key(p.id)) for _ in range(5)]
    seen = {storage.admin_epoch()}
    for k in keys:
        await storage.revoke_key(k.prefix)
        seen.add(storage.admin_epoch())
    assert len(seen) == 6


async def test_what_one_handle_writes_another_reads_after_reopening(url):
    first = await open_storage(url)
    p = await first.create_project(project())
    k = await first.create_key(key(p.id))
    await first.close()
    second = await open_storage(url)  # migrations already applied: opening again is fine
    try:
        assert await second.get_project(p.id) == p
        assert await second.get_key(k.prefix) == k
    finally:
        await second.close()


async def test_not_found_and_conflict_are_storage_errors():
    assert issubclass(RecordNotFound, StorageError)
    assert issubclass(StateConflict, StorageError)


async def test_an_unknown_url_scheme_is_a_clear_storage_error():
    with pytest.raises(StorageError, match="mysql"):
        await open_storage("mysql://localhost/db")
