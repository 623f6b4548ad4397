"""The instance registry and the admin change counter, on every backend."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from model_gateway.storage import ProjectRecord, open_storage
from model_gateway.storage.base import KeyRecord, ReservationRecord

_ids = itertools.count()


@pytest.fixture
async def storage(storage_url):
    backend = await open_storage(storage_url)
    yield backend
    await backend.close()


def instance_id() -> str:
    return f"elsewhere:{next(_ids)}:{time.time_ns()}"


async def mine(storage, *ids: str) -> dict:
    return {i.id: i for i in await storage.list_instances() if i.id in ids}


async def project_with_key(storage) -> tuple[str, str]:
    pid, prefix = f"prj_inst_{time.time_ns()}", f"proj_live_{time.time_ns() % 10**8:08d}"
    await storage.create_project(ProjectRecord(id=pid, name="i"))
    await storage.create_key(
        KeyRecord(
            id=f"key_{prefix}",
            prefix=prefix,
            key_hash=b"h",
            project_id=pid,
            scopes=frozenset({"inference"}),
        )
    )
    return pid, prefix


async def test_register_renew_acknowledge_deregister(storage):
    a, b = instance_id(), instance_id()
    latest = await storage.admin_change()
    assert await storage.renew_instance(a, 60_000, 0) == latest
    await storage.renew_instance(b, 60_000, latest)
    found = await mine(storage, a, b)
    assert set(found) == {a, b} and found[a].live and found[b].live
    assert (found[a].acked, found[b].acked) == (0, latest)
    lease = found[a].lease_until
    assert lease - 60_000 - 1000 <= found[a].started_at <= lease - 60_000 + 1000

    await asyncio.sleep(0.01)
    await storage.renew_instance(a, 60_000, 0)  # renewing never lowers what was acked
    await storage.acknowledge_admin(a, latest + 5)
    await storage.acknowledge_admin(a, latest + 2)  # nor does a late acknowledgement
    renewed = (await mine(storage, a))[a]
    assert renewed.acked == latest + 5
    assert renewed.lease_until > lease and renewed.started_at == found[a].started_at

    await storage.acknowledge_admin("nobody:1:1", 10)  # unknown: nothing happens
    await storage.deregister_instance(b)
    await storage.deregister_instance(b)  # twice: a no-op
    assert set(await mine(storage, a, b, "nobody:1:1")) == {a}


async def test_a_lease_ends_on_its_own_and_is_forgotten_later(storage):
    short, long = instance_id(), instance_id()
    await storage.renew_instance(short, 50, 0)
    await storage.renew_instance(long, 60_000, 0)
    await asyncio.sleep(0.2)
    found = await mine(storage, short, long)
    assert not found[short].live and found[long].live
    await storage.forget_instances(60_000)
    assert short in await mine(storage, short)  # ended 0.15 s ago: not forgotten yet
    assert await storage.forget_instances(100) >= 1
    assert set(await mine(storage, short, long)) == {long}
    await storage.renew_instance(short, 60_000, 0)  # a renewal brings it back, live
    assert (await mine(storage, short))[short].live


async def test_every_key_or_project_change_takes_a_change_number(storage):
    pid, prefix = await project_with_key(storage)
    before = await storage.admin_change()
    await storage.update_key(prefix, {"rpm": 7})
    after_key = await storage.admin_change()
    assert after_key > before
    await storage.update_project(pid, {"rpm": 9})
    after_project = await storage.admin_change()
    assert after_project > after_key
    await storage.revoke_key(prefix)
    after_revoke = await storage.admin_change()
    assert after_revoke > after_project
    await storage.archive_project(pid)
    after_archive = await storage.admin_change()
    assert after_archive > after_revoke
    # The renewal answers the newest number: what the instance must apply before serving.
    assert await storage.renew_instance(instance_id(), 60_000, 0) == after_archive


async def test_money_and_new_records_take_no_change_number(storage):
    before = await storage.admin_change()
    pid, prefix = await project_with_key(storage)
    await storage.add_credit(pid, 1000, "2026-11")
    hold = ReservationRecord(
        id=f"rsv_inst_{time.time_ns()}",
        project_id=pid,
        key_id=f"key_{prefix}",
        amount=10,
        month="2026-11",
        owner="elsewhere:1:1",
        lease_until=2**40,
        created_at=0,
    )
    await storage.reserve(hold)
    await storage.release(hold.id)
    assert await storage.admin_change() == before  # no key cache empties for these


async def test_catching_up_moves_the_epoch_only_for_an_unheard_change(storage):
    applied = storage.admin_applied()
    epoch = storage.admin_epoch()
    storage.catch_up_admin(applied)
    assert storage.admin_epoch() == epoch
    storage.catch_up_admin(applied + 1000)
    assert storage.admin_applied() == applied + 1000
    if storage.instances_acknowledge_changes:  # SQLite's epoch is its file: nothing to move
        assert storage.admin_epoch() != epoch


@pytest.mark.postgres
async def test_another_handle_hears_the_change_number(postgres_url):
    changer, listener = await open_storage(postgres_url), await open_storage(postgres_url)
    heard: list[int] = []
    try:
        listener.watch_admin(heard.append)
        _, prefix = await project_with_key(changer)
        await changer.revoke_key(prefix)
        change = await changer.admin_change()
        deadline = time.monotonic() + 5
        while listener.admin_applied() < change and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert listener.admin_applied() == change
        assert heard and heard[-1] == change
    finally:
        await changer.close()
        await listener.close()
