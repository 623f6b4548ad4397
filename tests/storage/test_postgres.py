"""What only the PostgreSQL backend promises: the admin epoch across processes through
LISTEN/NOTIFY, migrations raced by several processes, a log queue that survives commits
out of issue order, and rules the database enforces for any writer."""

from __future__ import annotations

import asyncio
import sys
import time

import asyncpg
import msgspec
import pytest

from model_gateway.storage import (
    KeyRecord,
    LimitReached,
    ProjectRecord,
    ReceiptRecord,
    ReservationRecord,
    StorageError,
    TreeHeadRecord,
    open_storage,
)
from model_gateway.storage.base import LogEntry, LogTile, RecordNotFound, StateConflict, new_id
from model_gateway.storage.postgres import _migrations
from tests.storage.backends import postgres_database

pytestmark = pytest.mark.postgres

MONTH = "2026-11"


@pytest.fixture
async def storage(postgres_url):
    backend = await open_storage(postgres_url)
    yield backend
    await backend.close()


@pytest.fixture
async def raw(postgres_url):
    """A plain connection: a writer that is not a storage handle (an operator's psql)."""
    conn = await asyncpg.connect(postgres_url)
    yield conn
    await conn.close()


async def project_and_key(storage, **key_fields) -> tuple[ProjectRecord, KeyRecord]:
    project = await storage.create_project(ProjectRecord(id=new_id("prj"), name="pg"))
    key = await storage.create_key(
        KeyRecord(
            id=new_id("key"),
            prefix="proj_live_" + new_id("p")[2:],
            key_hash=b"h",
            project_id=project.id,
            scopes=frozenset({"inference"}),
            **key_fields,
        )
    )
    return project, key


async def moves(storage, since, within_s: float = 5.0) -> bool:
    """Whether the epoch leaves `since` within the time a notification may take."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if storage.admin_epoch() != since:
            return True
        await asyncio.sleep(0.005)
    return False


@pytest.fixture
async def watcher(postgres_url):
    """A handle that only watches: opened after a test's setup, it hears no notification of
    that setup (LISTEN starts at its own commit), so any move comes from what follows."""
    handles = []

    async def open_watcher():
        handles.append(await open_storage(postgres_url))
        return handles[-1]

    yield open_watcher
    for handle in handles:
        await handle.close()


async def test_a_revocation_by_any_writer_moves_the_epoch(storage, raw, watcher):
    _, key = await project_and_key(storage)
    seen = await watcher()
    before = seen.admin_epoch()
    await raw.execute("UPDATE api_keys SET state = 'revoked' WHERE prefix = $1", key.prefix)
    assert await moves(seen, before)


async def test_a_revocation_by_another_process_moves_the_epoch(storage, postgres_url, watcher):
    _, key = await project_and_key(storage)
    seen = await watcher()
    before = seen.admin_epoch()
    script = (
        "import asyncio, sys\n"
        "from model_gateway.storage import open_storage\n"
        "async def main():\n"
        "    s = await open_storage(sys.argv[1])\n"
        "    await s.revoke_key(sys.argv[2])\n"
        "    await s.close()\n"
        "asyncio.run(main())\n"
    )
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, postgres_url, key.prefix
    )
    assert await done.wait() == 0
    assert await moves(seen, before)
    assert (await seen.get_key(key.prefix)).state == "revoked"


async def test_money_moves_do_not_move_the_epoch(storage, raw, watcher):
    """Reservations touch the project and key rows: they must not empty every key cache."""
    project, key = await project_and_key(storage)
    other, _ = await project_and_key(storage)
    seen = await watcher()
    before = seen.admin_epoch()
    await storage.add_credit(project.id, 1_000, MONTH)
    hold = ReservationRecord(
        id=new_id("rsv"),
        project_id=project.id,
        key_id=key.id,
        amount=100,
        month=MONTH,
        owner="pg:1:1",
        lease_until=2**40,
        created_at=0,
    )
    await storage.reserve(hold)
    await storage.renew_leases("pg:1:1", 2**41)
    await storage.settle(receipt_for(hold, new_id("rcpt")))
    # Notifications arrive in commit order: once this admin change's has, any earlier has.
    await raw.execute("UPDATE projects SET rpm = 7 WHERE id = $1", other.id)
    assert await moves(seen, before)
    assert seen.admin_epoch() == before + 1


async def test_without_its_listener_the_epoch_never_repeats_until_it_is_back(storage, raw):
    pid = storage._listener.get_server_pid()
    await raw.execute("SELECT pg_terminate_backend($1)", pid)
    deadline = time.monotonic() + 5
    while storage.admin_epoch() == storage.admin_epoch():
        assert time.monotonic() < deadline, "the lost listener went unnoticed"
        await asyncio.sleep(0.001)
    # It reconnects on its own, and then a cache may be trusted again.
    deadline = time.monotonic() + 10
    while storage.admin_epoch() != storage.admin_epoch():
        assert time.monotonic() < deadline, "the listener did not come back"
        await asyncio.sleep(0.01)
    assert storage._listener.get_server_pid() != pid
    _, key = await project_and_key(storage)
    await asyncio.sleep(0.1)
    before = storage.admin_epoch()
    await raw.execute("UPDATE api_keys SET state = 'revoked' WHERE prefix = $1", key.prefix)
    assert await moves(storage, before)


async def test_processes_starting_at_once_migrate_the_database_once(postgres_url):
    with postgres_database() as url:
        handles = await asyncio.gather(*(open_storage(url) for _ in range(4)))
        try:
            await handles[0].create_project(ProjectRecord(id="prj_race", name="x"))
            assert (await handles[3].get_project("prj_race")).name == "x"
        finally:
            for handle in handles:
                await handle.close()
        conn = await asyncpg.connect(url)
        try:
            versions = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
        finally:
            await conn.close()
        assert [v["version"] for v in versions] == [n for n, _ in _migrations()]


def receipt_for(hold: ReservationRecord, receipt_id: str) -> ReceiptRecord:
    return ReceiptRecord(
        id=receipt_id,
        reservation_id=hold.id,
        project_id=hold.project_id,
        key_id=None,
        request_id="req_pg",
        kind="inference",
        endpoint="/v1/responses",
        model_or_runtime="echo-1",
        status="succeeded",
        usage={},
        cost=1,
        month=MONTH,
        created_at=0,
        request_sha256="a" * 64,
        response_sha256="b" * 64,
    )


async def test_a_receipt_committed_after_a_later_one_was_logged_is_still_logged(postgres_url):
    """Two instances settle at once: the first receipt issued commits last, after the
    second was already logged. It must still reach the log."""
    with postgres_database() as url:
        storage = await open_storage(url)
        slow = await asyncpg.connect(url)
        try:
            # Two projects: settlements of one project wait for each other (its row lock).
            holds = []
            for i in range(2):
                await storage.create_project(ProjectRecord(id=f"prj_q{i}", name="q"))
                await storage.add_credit(f"prj_q{i}", 100, MONTH)
                holds.append(
                    ReservationRecord(
                        id=f"rsv_q{i}",
                        project_id=f"prj_q{i}",
                        key_id=None,
                        amount=10,
                        month=MONTH,
                        owner="pg:1:1",
                        lease_until=2**40,
                        created_at=0,
                    )
                )
                await storage.reserve(holds[-1])
            early = receipt_for(holds[0], "rcpt_early")
            transaction = slow.transaction()
            await transaction.start()
            await slow.execute(
                "INSERT INTO receipts (id, reservation_id, project_id, request_id, kind,"
                " endpoint, model_or_runtime, status, usage, cost, month, created_at,"
                " request_sha256, response_sha256) VALUES ($1, $2, 'prj_q0', 'r', 'inference',"
                " '/v1/responses', 'echo-1', 'succeeded', '{}', 1, $3, 0, $4, $4)",
                early.id,
                early.reservation_id,
                MONTH,
                "a" * 64,
            )
            late = receipt_for(holds[1], "rcpt_late")
            assert await storage.settle(late)
            assert [r.id for r in await storage.unlogged_receipts(10)] == ["rcpt_late"]
            await storage.append_log_tiles(
                [LogEntry(leaf_index=0, receipt_id="rcpt_late")],
                [LogTile(level=0, index=0, hashes=bytes(32))],
                TreeHeadRecord(size=1, root_hash="r", timestamp="t", key_id="k", signature="s"),
            )
            await transaction.commit()
            assert [r.id for r in await storage.unlogged_receipts(10)] == ["rcpt_early"]
        finally:
            await slow.close()
            await storage.close()


async def test_two_instances_integrating_the_same_leaves_one_loses_whole(postgres_url):
    """Two gateway instances integrate the same receipts at once: one appends, the other
    gets StateConflict and writes nothing (no second head, no tile of its own)."""
    with postgres_database() as url:
        first, second = await open_storage(url), await open_storage(url)
        try:
            await first.create_project(ProjectRecord(id="prj_g", name="g"))
            await first.add_credit("prj_g", 100, MONTH)
            hold = ReservationRecord(
                id="rsv_g",
                project_id="prj_g",
                key_id=None,
                amount=10,
                month=MONTH,
                owner="pg:1:1",
                lease_until=2**40,
                created_at=0,
            )
            await first.reserve(hold)
            assert await first.settle(receipt_for(hold, "rcpt_g"))

            def append(storage, byte: int):
                return storage.append_log_tiles(
                    [LogEntry(leaf_index=0, receipt_id="rcpt_g")],
                    [LogTile(level=0, index=0, hashes=bytes([byte]) * 32)],
                    TreeHeadRecord(
                        size=1, root_hash=f"{byte}", timestamp="t", key_id="k", signature="s"
                    ),
                )

            outcomes = await asyncio.gather(
                append(first, 1), append(second, 2), return_exceptions=True
            )
            assert sorted(type(o).__name__ for o in outcomes) == ["NoneType", "StateConflict"]
            winner = 1 if outcomes[0] is None else 2
            assert await second.log_tiles([(0, 0)]) == {(0, 0): bytes([winner]) * 32}
            assert (await second.tree_head()).root_hash == f"{winner}"
            assert await first.unlogged_receipts(5) == []
        finally:
            await first.close()
            await second.close()


async def test_the_ledger_and_holds_cannot_be_rewritten_by_any_writer(storage, raw):
    project, _ = await project_and_key(storage)
    await storage.add_credit(project.id, 500, MONTH)
    await storage.reserve(
        ReservationRecord(
            id=new_id("rsv"),
            project_id=project.id,
            key_id=None,
            amount=100,
            month=MONTH,
            owner="pg:1:1",
            lease_until=2**40,
            created_at=0,
        )
    )
    for statement in (
        "DELETE FROM ledger WHERE project_id = $1",
        "UPDATE ledger SET amount = amount * 2 WHERE project_id = $1",
        "UPDATE reservations SET amount = 0 WHERE project_id = $1",
    ):
        with pytest.raises(asyncpg.PostgresError) as refused:
            await raw.execute(statement, project.id)
        assert refused.value.sqlstate == "GWC01"
    audit = await storage.audit(project.id, MONTH)
    assert audit.balance == audit.ledger_sum == 500
    assert audit.reserved == audit.open_reservations_sum == 100


async def test_a_raw_insert_of_a_hold_obeys_the_same_rules(storage, raw):
    """The rules are the database's: even a hold written by hand cannot overspend."""
    project, _ = await project_and_key(storage)
    await storage.add_credit(project.id, 100, MONTH)
    with pytest.raises(asyncpg.PostgresError) as refused:
        await raw.execute(
            "INSERT INTO reservations (id, project_id, amount, month, owner, lease_until,"
            " created_at) VALUES ('rsv_raw', $1, 101, $2, 'psql', 0, 0)",
            project.id,
            MONTH,
        )
    assert (refused.value.sqlstate, str(refused.value)) == ("GWL01", "insufficient_balance")
    with pytest.raises(LimitReached):
        await storage.reserve(
            ReservationRecord(
                id=new_id("rsv"),
                project_id=project.id,
                key_id=None,
                amount=101,
                month=MONTH,
                owner="pg:1:1",
                lease_until=2**40,
                created_at=0,
            )
        )


@pytest.mark.parametrize(
    "scheme", ["postgresql://", "postgres://", "postgresql+asyncpg://"], ids=lambda s: s[:-3]
)
async def test_each_postgres_url_form_opens_the_backend(postgres_url, scheme):
    storage = await open_storage(scheme + postgres_url.split("://", 1)[1])
    try:
        await storage.health()
    finally:
        await storage.close()


async def test_a_server_that_does_not_answer_is_a_storage_error():
    with pytest.raises(StorageError, match="cannot open PostgreSQL"):
        await open_storage("postgresql://postgres@127.0.0.1:1/nothing")


async def test_driver_errors_leave_every_method_as_storage_errors(postgres_url):
    """Translated once, by the Storage base class: a closed pool, a duplicate key."""
    with postgres_database() as url:
        storage = await open_storage(url)
        await storage.create_project(ProjectRecord(id="prj_t", name="t"))
        with pytest.raises(StateConflict) as twin:
            await storage.create_project(ProjectRecord(id="prj_t", name="again"))
        assert "INSERT" not in str(twin.value).upper() and "projects" not in str(twin.value)
        assert "create_project" in str(twin.value)
        with pytest.raises(RecordNotFound):
            await storage.add_credit("prj_missing", 1, MONTH)
        await storage.close()
        for call in (
            storage.get_project("prj_t"),
            storage.health(),
            storage.add_credit("prj_t", 1, MONTH),
        ):
            with pytest.raises(StorageError) as closed:
                await call
            assert not isinstance(closed.value, asyncpg.PostgresError | asyncpg.InterfaceError)


def _hold(project_id: str, amount: int) -> ReservationRecord:
    return ReservationRecord(
        id=new_id("rsv"), project_id=project_id, key_id=None, amount=amount, month=MONTH,
        owner="pg:1:1", lease_until=2**40, created_at=0,
    )  # fmt: skip


async def test_the_batch_functions_hold_and_settle_as_statements_alone(storage, raw):
    """Migration 0015, called as the handle calls it (the handle runs each item alone
    when a batch raises, which would hide a broken function)."""
    project, _ = await project_and_key(storage)
    await storage.add_credit(project.id, 1_000, MONTH)
    holds = [_hold(project.id, 300), _hold(project.id, 300)]
    await raw.execute("SELECT gateway_reserve_many($1::jsonb)", msgspec.json.encode(holds).decode())
    account = await storage.project_account(project.id, MONTH)
    assert (account.balance, account.reserved) == (1_000, 600)
    # A batch with one item refused commits nothing.
    refused = [_hold(project.id, 100), _hold(project.id, 301)]
    with pytest.raises(asyncpg.PostgresError) as raised:
        await raw.execute(
            "SELECT gateway_reserve_many($1::jsonb)", msgspec.json.encode(refused).decode()
        )
    assert raised.value.sqlstate == "GWL01"
    assert (await storage.project_account(project.id, MONTH)).reserved == 600
    receipts = [
        msgspec.structs.replace(receipt_for(holds[0], new_id("rcpt")), cost=250),
        msgspec.structs.replace(receipt_for(holds[1], new_id("rcpt")), cost=301),  # above its hold
        receipt_for(holds[0], new_id("rcpt")),  # consumed
    ]
    answers = await raw.fetchval(
        "SELECT gateway_settle_many($1::jsonb)", msgspec.json.encode(receipts).decode()
    )
    assert answers == [True, False, False]
    audit = await storage.audit(project.id, MONTH)
    assert (audit.balance, audit.reserved, audit.month_spend) == (750, 300, 250)
    assert audit.balance == audit.ledger_sum


async def test_checkpoint_vacuums_the_churned_tables_so_new_holds_reuse_their_space(postgres_url):
    # Holds are inserted and deleted by the thousand a second; with autovacuum off (as on these
    # machines) or not yet due, every deleted one stays in the table for scans to step over.
    with postgres_database() as url:
        storage = await open_storage(url)
        raw = await asyncpg.connect(url)
        try:
            project, _ = await project_and_key(storage)

            async def churn(round_: int) -> int:
                await raw.execute(
                    "INSERT INTO reservations (id, project_id, amount, month, owner,"
                    " lease_until, created_at) SELECT 'rsv_' || $1 || '_' || n, $2, 0, $3,"
                    " 'churn', 0, 0 FROM generate_series(1, 4000) AS n",
                    str(round_),
                    project.id,
                    MONTH,
                )
                await raw.execute("DELETE FROM reservations WHERE owner = 'churn'")
                return await raw.fetchval("SELECT pg_relation_size('reservations')")

            first = await churn(1)
            await storage.checkpoint()  # the first one is due at once
            second = await churn(2)
        finally:
            await raw.close()
            await storage.close()
    assert first > 200_000  # 4,000 rows took their pages
    assert second == first  # and the next 4,000 found them free again
