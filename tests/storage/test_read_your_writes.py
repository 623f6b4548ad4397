"""A read that starts after a write has returned sees it, however other reads interleave
on the same handle. SQLite's handle shares one connection among coroutines: a read that
started while another read's statement was still open would share that read's older
snapshot, and miss a write committed in between."""

from __future__ import annotations

import asyncio

import pytest

from model_gateway.storage import open_storage
from model_gateway.storage.base import ProjectRecord, new_id, now_s


@pytest.fixture
async def storage(storage_url):
    store = await open_storage(storage_url)
    yield store
    await store.close()


async def test_a_write_is_seen_by_the_next_read_while_other_reads_run(storage) -> None:
    for _ in range(30):  # a history for the busy readers to walk through
        await storage.create_project(
            ProjectRecord(id=new_id("prj"), name="old", created_at=now_s())
        )
    done = asyncio.Event()

    async def busy_reader() -> int:
        reads = 0
        while not done.is_set():
            await storage.list_projects()
            reads += 1
        return reads

    readers = [asyncio.create_task(busy_reader()) for _ in range(4)]
    try:
        missed = 0
        for _ in range(200):
            fresh = ProjectRecord(id=new_id("prj"), name="fresh", created_at=now_s())
            await storage.create_project(fresh)
            if await storage.get_project(fresh.id) is None:
                missed += 1
    finally:
        done.set()
        reads = await asyncio.gather(*readers)
    assert min(reads) > 0  # the readers really interleaved
    assert missed == 0


async def test_a_read_never_sees_a_transaction_half_done(storage) -> None:
    """Replacing a project's payer addresses deletes the old rows and inserts the new ones
    in one transaction: a read in between must see the old list or the new, never none."""
    project = ProjectRecord(id=new_id("prj"), name="payer", created_at=now_s())
    await storage.create_project(project)
    addresses = ["0x" + "a" * 40, "0x" + "b" * 40]
    await storage.set_payer_addresses(project.id, addresses)
    seen: list[list[str]] = []

    async def replace() -> None:
        for _ in range(50):
            await storage.set_payer_addresses(project.id, addresses)

    async def read() -> None:
        for _ in range(200):
            seen.append(await storage.payer_addresses(project.id))

    await asyncio.gather(replace(), read(), read())
    assert len(seen) == 400
    assert all(found == addresses for found in seen), [f for f in seen if f != addresses][:3]
