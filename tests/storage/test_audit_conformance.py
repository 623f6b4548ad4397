"""The audit log's storage (AuditPort, migration 0019), on every backend: each audited
change writes its entry in its own transaction (a change without its entry, or an entry
without its change, cannot be stored), the list is newest first with cursors and filters,
and the database itself refuses to update or delete an entry."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from model_gateway.storage import open_storage
from model_gateway.storage.base import (
    AuditEntry,
    KeyRecord,
    PaymentRecord,
    ProjectRecord,
    PurchaseRecord,
    StateConflict,
    Storage,
    StorageError,
    UserRecord,
    new_id,
)

MONTH = "2026-11"


@pytest.fixture
async def storage(storage_url):
    backend = await open_storage(storage_url)
    yield backend
    await backend.close()


def entry(actor: str, action: str = "project.update", entry_id: str | None = None) -> AuditEntry:
    return AuditEntry(
        id=entry_id or new_id("aud"),
        at=1_700_000_000,
        actor=actor,
        action=action,
        target={"type": "project", "id": "prj_x"},
        changes={"rpm": 5, "monthly_budget": "12.500000", "allow_models": ["a", "b"]},
        request_id="req_1",
    )


def actor() -> str:
    """An actor of this test alone: the PostgreSQL database is shared by the run's tests."""
    return f"cli:test-{secrets.token_hex(4)}"


async def listed(storage: Storage, who: str, **filters: object) -> list[AuditEntry]:
    return [e for _, e in await storage.list_audit(100, None, actor=who, **filters)]


async def test_entries_newest_first_with_cursors_and_filters(storage):
    who, other = actor(), actor()
    written = [entry(who, "key.create"), entry(who, "key.revoke"), entry(who, "key.create")]
    pid = new_id("prj")
    await storage.create_project(ProjectRecord(id=pid, name="a"), entry(other, "project.create"))
    for number, each in enumerate(written):
        await storage.update_project(pid, {"rpm": number + 1}, each)

    assert await listed(storage, who) == written[::-1]  # every field as written
    assert await listed(storage, who, action="key.create") == [written[2], written[0]]
    assert [e.action for e in await listed(storage, other)] == ["project.create"]

    first = await storage.list_audit(2, None, actor=who)
    assert [e for _, e in first] == [written[2], written[1]]
    rest = await storage.list_audit(2, first[-1][0], actor=who)
    assert [e for _, e in rest] == [written[0]]
    assert await storage.list_audit(2, rest[-1][0], actor=who) == []


@dataclass(frozen=True)
class Change:
    """An audited change of one storage method, and what shows that it was made."""

    make: Callable[[Storage, AuditEntry], Awaitable[object]]
    made: Callable[[Storage], Awaitable[bool]]


async def _change(storage: Storage, name: str) -> Change:
    """Set up what the change needs (unaudited), then the change itself."""
    pid, other, email = new_id("prj"), new_id("prj"), f"{new_id('u')}@example.com"
    for each in (pid, other):
        await storage.create_project(ProjectRecord(id=each, name="p"))
    await storage.add_credit(pid, 1_000, MONTH)
    key = KeyRecord(
        id=new_id("key"),
        prefix=new_id("pfx"),
        key_hash=secrets.token_bytes(32),
        project_id=pid,
        scopes=frozenset({"inference"}),
    )
    await storage.create_key(key)
    user = UserRecord(id=new_id("usr"), email=email, password_hash="$argon2id$x")
    await storage.create_user(user, "member")
    session = secrets.token_bytes(32)
    tx = "0x" + secrets.token_hex(32)
    payment = PaymentRecord(
        id=new_id("pay"), project_id=pid, reference="inv-1", amount=5, month=MONTH
    )
    purchase = PurchaseRecord(
        tx_hash=tx, project_id=pid, sender="0x" + "11" * 20, token_units=7, amount=3, month=MONTH
    )
    fresh = ProjectRecord(id=new_id("prj"), name="new")
    fresh_key = KeyRecord(**{**{f: getattr(key, f) for f in KeyRecord.__struct_fields__},
                              "id": new_id("key"), "prefix": new_id("pfx")})  # fmt: skip
    newcomer = UserRecord(id=new_id("usr"), email="n" + email, password_hash="$argon2id$x")

    async def balance(s: Storage) -> int:
        return (await s.project_account(pid, MONTH)).balance

    async def project(s: Storage) -> ProjectRecord:
        found = await s.get_project(pid)
        assert found is not None
        return found

    async def stored_key(s: Storage) -> KeyRecord:
        found = await s.get_key(key.prefix)
        assert found is not None
        return found

    async def stored_user(s: Storage) -> UserRecord:
        found = await s.get_user(email)
        assert found is not None
        return found

    changes = {
        "create_project": Change(
            lambda s, a: s.create_project(fresh, a),
            lambda s: _is_not_none(s.get_project(fresh.id)),
        ),
        "update_project": Change(
            lambda s, a: s.update_project(pid, {"rpm": 9}, a),
            lambda s: _is(project(s), lambda p: p.rpm == 9),
        ),
        "archive_project": Change(
            lambda s, a: s.archive_project(pid, a),
            lambda s: _is(project(s), lambda p: p.state == "archived"),
        ),
        "create_key": Change(
            lambda s, a: s.create_key(fresh_key, "label", a),
            lambda s: _is_not_none(s.get_key(fresh_key.prefix)),
        ),
        "update_key": Change(
            lambda s, a: s.update_key(key.prefix, {"rpm": 9}, a),
            lambda s: _is(stored_key(s), lambda k: k.rpm == 9),
        ),
        "revoke_key": Change(
            lambda s, a: s.revoke_key(key.prefix, a),
            lambda s: _is(stored_key(s), lambda k: k.state == "revoked"),
        ),
        "create_user": Change(
            lambda s, a: s.create_user(newcomer, None, a),
            lambda s: _is_not_none(s.get_user(newcomer.email)),
        ),
        "grant_project": Change(
            lambda s, a: s.grant_project(email, pid, a),
            lambda s: _is(s.granted_projects(user.id), lambda granted: pid in granted),
        ),
        "disable_user": Change(
            lambda s, a: s.disable_user(email, a),
            lambda s: _is(stored_user(s), lambda u: u.disabled),
        ),
        "add_credit": Change(
            lambda s, a: s.add_credit(pid, 5, MONTH, a),
            lambda s: _is(balance(s), lambda b: b == 1_005),
        ),
        "record_payment": Change(
            lambda s, a: s.record_payment(payment, a),
            lambda s: _is(balance(s), lambda b: b == 1_005),
        ),
        "record_purchase": Change(
            lambda s, a: s.record_purchase(purchase, a),
            lambda s: _is_not_none(s.get_purchase(tx)),
        ),
        "set_payer_addresses": Change(
            lambda s, a: s.set_payer_addresses(pid, ["0x" + secrets.token_hex(20)], a),
            lambda s: _is(s.payer_addresses(pid), bool),
        ),
        "create_session": Change(
            lambda s, a: s.create_session(session, user.id, 10**10, a),
            lambda s: _is_not_none(s.session_user(session, 0)),
        ),
        "record_login_failure": Change(
            lambda s, a: s.record_login_failure([f"email:{email}"], 10**10, a),
            lambda s: _is(s.login_failures(f"email:{email}", 0), bool),
        ),
    }
    return changes[name]


async def _is_not_none(found: Awaitable[object]) -> bool:
    return await found is not None


async def _is(found: Awaitable[object], test: Callable[[object], object]) -> bool:
    return bool(test(await found))


AUDITED = [
    "create_project",
    "update_project",
    "archive_project",
    "create_key",
    "update_key",
    "revoke_key",
    "create_user",
    "grant_project",
    "disable_user",
    "add_credit",
    "record_payment",
    "record_purchase",
    "set_payer_addresses",
    "create_session",
    "record_login_failure",
]


@pytest.mark.parametrize("method", AUDITED)
async def test_a_change_and_its_entry_are_stored_together(storage, method):
    who = actor()
    change = await _change(storage, method)
    written = entry(who)
    await change.make(storage, written)
    assert await change.made(storage)
    [stored] = await listed(storage, who)
    if method == "create_user":  # the role is decided in the insert's transaction
        assert stored.changes["role"] == "member"  # not the first user (set up before)
    else:
        assert stored == written


@pytest.mark.parametrize("method", AUDITED)
async def test_an_entry_that_cannot_be_written_undoes_its_change(storage, method):
    """The failure injected after the change: its entry's id is taken, so the insert of
    the entry fails in the change's transaction. Neither is left."""
    who, earlier = actor(), entry(actor())
    await storage.create_project(ProjectRecord(id=new_id("prj"), name="e"), earlier)
    change = await _change(storage, method)
    with pytest.raises(StorageError):
        await change.make(storage, entry(who, entry_id=earlier.id))
    assert not await change.made(storage)
    assert await listed(storage, who) == []


async def test_a_change_that_fails_leaves_no_entry(storage):
    """The other order: a change refused by the database (a revoked key revoked again, an
    archived project changed, a payment's reference recorded twice, an email taken) writes
    no entry."""
    who = actor()
    revoke = await _change(storage, "revoke_key")
    await revoke.make(storage, entry(actor()))
    archive = await _change(storage, "archive_project")
    await archive.make(storage, entry(actor()))
    pay = await _change(storage, "record_payment")
    await pay.make(storage, entry(actor()))
    user = await _change(storage, "create_user")
    await user.make(storage, entry(actor()))
    for refused in (revoke, archive, pay, user):
        with pytest.raises(StateConflict):
            await refused.make(storage, entry(who))
    assert await listed(storage, who) == []


async def test_the_database_refuses_to_change_or_delete_an_entry(storage, storage_url):
    """Raw SQL, as an operator with a database shell would send it."""
    who = actor()
    written = entry(who)
    await storage.create_project(ProjectRecord(id=new_id("prj"), name="r"), written)
    statements = [
        "UPDATE audit_log SET actor = 'cli:someone-else'",
        "DELETE FROM audit_log",
    ]
    if storage_url.startswith("sqlite"):
        conn = sqlite3.connect(storage_url.removeprefix("sqlite:///"))
        try:
            for sql in statements:
                with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                    conn.execute(sql)
        finally:
            conn.close()
    else:
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncpg.connect(storage_url.replace("postgresql+asyncpg", "postgresql"))
        try:
            for sql in [*statements, "TRUNCATE audit_log"]:
                with pytest.raises(asyncpg.PostgresError, match="append-only"):
                    await conn.execute(sql)
        finally:
            await conn.close()
    assert await listed(storage, who) == [written]
