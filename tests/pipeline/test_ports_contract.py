"""One contract for the ports, run against the in-memory implementations (`pipeline.memory`)
and the gateway's storage-backed ones over a real SQLite file: what a host may rely on."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import pytest

from model_gateway.gateway.access.keyring import KeyRing
from model_gateway.gateway.metering.storage_meter import StorageMeter, current_month
from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.errors import (
    BudgetExceeded,
    Forbidden,
    InsufficientBalance,
    InvalidApiKey,
)
from model_gateway.pipeline.hold import Hold
from model_gateway.pipeline.memory import Key, MemoryKeys, MemoryMeter, Project
from model_gateway.storage import open_storage
from tests.support.records import add_key, add_project


@dataclass
class World:
    """One project (balance 1000, budget 800) with a usable key (limit 600), a revoked key
    and a key of an archived project, and a plain project (balance 500, no budget), behind
    one KeyLookup and one StorageMeter."""

    keys: Any
    meter: Any
    project_id: str
    key_id: str
    usable: str
    revoked: str
    archived: str
    books: Any  # async (project id=the first) -> (balance, reserved)
    plain_project_id: str
    close: Any = None  # async () -> None: what the world holds open (a storage)


async def memory_world(tmp_path) -> World:
    projects = {
        "prj_a": Project("prj_a", balance=1000, monthly_budget=800),
        "prj_old": Project("prj_old", balance=1000, archived=True),
        "prj_plain": Project("prj_plain", balance=500),
    }
    keys = {
        "k-usable": Key("key_a", "prj_a", frozenset({"inference"}), monthly_limit=600),
        "k-revoked": Key("key_r", "prj_a", frozenset({"inference"}), revoked=True),
        "k-archived": Key("key_o", "prj_old", frozenset({"inference"})),
    }
    meter = MemoryMeter(projects, keys)

    async def books(project_id="prj_a"):
        return projects[project_id].balance, meter.reserved(project_id)

    return World(
        MemoryKeys(projects, keys),
        meter,
        "prj_a",
        "key_a",
        "k-usable",
        "k-revoked",
        "k-archived",
        books,
        "prj_plain",
    )


async def storage_world(tmp_path) -> World:
    storage = await open_storage(f"sqlite:///{tmp_path}/gateway.db")
    pepper = secrets.token_bytes(32)
    project = await add_project(storage, "a", monthly_budget=800)
    await storage.add_credit(project.id, 1000, current_month())
    usable, key = await add_key(storage, pepper, project.id, monthly_limit=600)
    revoked, record = await add_key(storage, pepper, project.id)
    await storage.revoke_key(record.prefix)
    old = await add_project(storage, "old")
    archived, _ = await add_key(storage, pepper, old.id)
    await storage.archive_project(old.id)
    plain = await add_project(storage, "plain")
    await storage.add_credit(plain.id, 500, current_month())

    async def books(project_id=project.id):
        account = await storage.project_account(project_id, current_month())
        return account.balance, account.reserved

    return World(
        KeyRing(storage, pepper),
        StorageMeter(storage),
        project.id,
        key.id,
        usable,
        revoked,
        archived,
        books,
        plain.id,
        storage.close,
    )


@pytest.fixture(params=["memory", "storage"])
async def world(request, tmp_path):
    build = memory_world if request.param == "memory" else storage_world
    world = await build(tmp_path)
    yield world
    if world.close is not None:
        await world.close()  # its aiosqlite thread would keep the process from exiting


def settlement(cost: int) -> Settlement:
    return Settlement(
        receipt_id="rcpt_" + secrets.token_hex(12),
        request_id="req_" + secrets.token_hex(12),
        kind="inference",
        endpoint="/v1/chat/completions",
        subject="echo-1",
        status="succeeded",
        usage={"input_tokens": 1, "output_tokens": 1},
        cost=cost,
        request_body=b"{}",
        response_sha256=None,
    )


async def test_a_usable_key_gives_its_key_and_project(world):
    key, project = await world.keys.authenticate(world.usable)
    assert (key.id, project.id) == (world.key_id, world.project_id)
    assert "inference" in key.scopes


@pytest.mark.parametrize("which", ["unknown", "revoked"])
async def test_unknown_and_revoked_keys_are_invalid(world, which):
    presented = world.revoked if which == "revoked" else "proj_live_" + "x" * 32
    with pytest.raises(InvalidApiKey):
        await world.keys.authenticate(presented)


async def test_an_archived_projects_key_is_forbidden(world):
    with pytest.raises(Forbidden):
        await world.keys.authenticate(world.archived)


async def test_a_settled_hold_charges_its_cost_once(world):
    hold = await Hold.take(world.meter, world.project_id, world.key_id, 300)
    assert await world.books() == (1000, 300)
    await hold.settle(settlement(120))
    await hold.settle(settlement(120))  # idempotent
    await hold.release()  # a no-op once settled
    assert await world.books() == (880, 0)


async def test_the_charge_never_exceeds_the_hold(world):
    hold = await Hold.take(world.meter, world.project_id, world.key_id, 100)
    await hold.settle(settlement(100))
    assert await world.books() == (900, 0)


async def test_a_released_hold_charges_nothing(world):
    async with await Hold.take(world.meter, world.project_id, None, 500):
        assert await world.books() == (1000, 500)
    assert await world.books() == (1000, 0)


@pytest.mark.parametrize(
    ("key", "amount", "refusal"),
    [
        ("key", 601, BudgetExceeded),  # the key's monthly limit, 600
        (None, 801, BudgetExceeded),  # the project's monthly budget, 800
    ],
)
async def test_limits_refuse_before_anything_is_held(world, key, amount, refusal):
    with pytest.raises(refusal):
        await Hold.take(world.meter, world.project_id, world.key_id if key else None, amount)
    assert await world.books() == (1000, 0)


async def test_open_holds_count_against_the_balance(world):
    plain = world.plain_project_id
    first = await Hold.take(world.meter, plain, None, 300)
    with pytest.raises(InsufficientBalance):
        await Hold.take(world.meter, plain, None, 201)
    await first.release()
    second = await Hold.take(world.meter, plain, None, 201)
    await second.release()
    assert await world.books(plain) == (500, 0)
