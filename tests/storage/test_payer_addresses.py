"""A payer address belongs to at most one project of the deployment, on every backend; and
the migration that made it so (SQLite 0015, PostgreSQL 0016) on a database written at the
schema before it, where several projects could hold one address: the address stays with
the project that registered it first, the others lose it, and each removal is logged."""

from __future__ import annotations

import asyncio
import logging
import secrets
import sqlite3

import pytest

from model_gateway.storage import PayerAddressTaken, StateConflict, open_storage
from model_gateway.storage import postgres as postgres_backend
from model_gateway.storage import sqlite as sqlite_backend
from model_gateway.storage.base import ProjectRecord, new_id

# The last migration before the rule, per backend.
BEFORE = {"sqlite": 14, "postgresql": 15}


def address() -> str:
    return "0x" + secrets.token_hex(20)


@pytest.fixture
async def storage(fresh_storage_url):
    backend = await open_storage(fresh_storage_url)
    yield backend
    await backend.close()


async def project(storage) -> str:
    pid = new_id("prj")
    await storage.create_project(ProjectRecord(id=pid, name="p", created_at=1))
    return pid


async def test_an_address_another_project_holds_is_refused(storage):
    holder, other = await project(storage), await project(storage)
    held, free = address(), address()
    await storage.set_payer_addresses(holder, [held])
    await storage.set_payer_addresses(other, [free])
    with pytest.raises(PayerAddressTaken) as refused:
        await storage.set_payer_addresses(other, [free, held])
    assert isinstance(refused.value, StateConflict) and refused.value.address == held
    assert await storage.payer_addresses(other) == [free]  # nothing of the change written
    await storage.set_payer_addresses(holder, [held, address()])  # its own: no conflict
    await storage.set_payer_addresses(holder, [])
    await storage.set_payer_addresses(other, [held])
    assert await storage.payer_addresses(other) == sorted([held])


async def test_two_projects_racing_for_an_address_one_gets_it(storage):
    first, second = await project(storage), await project(storage)
    contested = address()
    outcomes = await asyncio.gather(
        *(storage.set_payer_addresses(p, [contested]) for p in (first, second) * 5),
        return_exceptions=True,
    )
    assert all(o is None or isinstance(o, PayerAddressTaken) for o in outcomes), outcomes
    holders = [p for p in (first, second) if await storage.payer_addresses(p) == [contested]]
    assert len(holders) == 1


# --- the migration ----------------------------------------------------------------------

# Registered in this order. The first registrant has the largest id and the newest
# project, so only the order of registration can make it the keeper.
FIRST, SECOND, THIRD = "prj_ffffffffffffffff", "prj_0000000000000000", "prj_8888888888888888"
CREATED = {FIRST: 300, SECOND: 100, THIRD: 200}
SHARED, OWN = address(), address()
REGISTRATIONS = [(FIRST, SHARED), (SECOND, OWN), (SECOND, SHARED), (THIRD, SHARED)]


def _sqlite_before(url: str) -> None:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    conn.create_function("gateway_pack", 2, sqlite_backend._pack, deterministic=True)
    conn.create_function("gateway_usage", 2, sqlite_backend._usage_part, deterministic=True)
    conn.create_function(
        "gateway_response_commitment", 2, sqlite_backend._response_commitment, deterministic=True
    )
    for number, script in sqlite_backend._migrations():
        if number > BEFORE["sqlite"]:
            break
        conn.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
    for pid, created in CREATED.items():
        conn.execute(
            "INSERT INTO projects (id, name, created_at) VALUES (?, 'p', ?)", (pid, created)
        )
    for pid, payer in REGISTRATIONS:  # as the console's PATCH did, one at a time
        conn.execute(
            "INSERT INTO payer_addresses (project_id, address) VALUES (?, ?)", (pid, payer)
        )
    conn.close()


async def _postgres_before(url: str) -> None:
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(  # as the backend's migrator makes it
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,"
            " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for number, script in postgres_backend._migrations():
            if number > BEFORE["postgresql"]:
                break
            async with conn.transaction():
                await conn.execute(script)
                await conn.execute("INSERT INTO schema_migrations VALUES ($1)", number)
        for pid, created in CREATED.items():
            await conn.execute(
                "INSERT INTO projects (id, name, created_at) VALUES ($1, 'p', $2)", pid, created
            )
        for pid, payer in REGISTRATIONS:  # each in a transaction of its own, as PATCH did
            await conn.execute(
                "INSERT INTO payer_addresses (project_id, address) VALUES ($1, $2)", pid, payer
            )
    finally:
        await conn.close()


async def test_the_migration_keeps_each_address_on_its_first_registrant(fresh_storage_url, caplog):
    backend = "sqlite" if fresh_storage_url.startswith("sqlite") else "postgresql"
    if backend == "sqlite":
        _sqlite_before(fresh_storage_url)
    else:
        await _postgres_before(fresh_storage_url)
    caplog.set_level(logging.WARNING)
    storage = await open_storage(fresh_storage_url)
    try:
        assert await storage.payer_addresses(FIRST) == [SHARED]
        assert await storage.payer_addresses(SECOND) == [OWN]
        assert await storage.payer_addresses(THIRD) == []
        version = BEFORE[backend] + 1
        logged = sorted(r.getMessage() for r in caplog.records if "payer address" in r.getMessage())
        assert logged == sorted(
            f"storage migration {version}: payer address {SHARED} removed from project {loser}"
            f" (project {FIRST} registered it first)"
            for loser in (SECOND, THIRD)
        )
        with pytest.raises(PayerAddressTaken):
            await storage.set_payer_addresses(SECOND, [OWN, SHARED])
    finally:
        await storage.close()
    # Opened again: nothing more to migrate, nothing logged again.
    caplog.clear()
    await (await open_storage(fresh_storage_url)).close()
    assert not [r for r in caplog.records if "payer address" in r.getMessage()]
