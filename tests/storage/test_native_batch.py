"""The group commit's batches run in C (storage/_batch.c): every write must come out as it
would through Python's sqlite3 module, the reference here. The same statements go to a
GroupCommitWriter and to a plain sqlite3 connection on two files of the same schema."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from model_gateway.storage._batch import Writer
from model_gateway.storage.group_commit import GroupCommitWriter

SCHEMA = """
CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                n INTEGER CHECK (n >= 0), data BLOB, x REAL);
CREATE TRIGGER no_forbidden BEFORE INSERT ON t WHEN NEW.name = 'forbidden'
BEGIN SELECT RAISE(ABORT, 'name_forbidden'); END;
CREATE TRIGGER rolls_back BEFORE INSERT ON t WHEN NEW.name = 'roll back'
BEGIN SELECT RAISE(ROLLBACK, 'rolled_back'); END;
INSERT INTO t (id, name, n) VALUES (1, 'taken', 1);
"""
INSERT = "INSERT INTO t (id, name, n, data, x) VALUES (?, ?, ?, ?, ?)"

# (statement, parameters): each fails alone, inside a batch that goes on.
FAILING = [
    pytest.param(INSERT, (2, "taken", 0, None, None), id="unique"),
    pytest.param(INSERT, (2, None, 0, None, None), id="not-null"),
    pytest.param(INSERT, (2, "b", -1, None, None), id="check"),
    pytest.param(INSERT, (2, "forbidden", 0, None, None), id="trigger-abort"),
    pytest.param(INSERT, (1, "b", 0, None, None), id="primary-key"),
    pytest.param(INSERT, ("x", "b", 0, None, None), id="datatype-mismatch"),
    pytest.param(INSERT, (2, "b", 2**63, None, None), id="integer-overflow"),
    pytest.param(INSERT, (2, "b", {}, None, None), id="unsupported-type"),
    pytest.param(INSERT, (2, "b"), id="too-few-parameters"),
    pytest.param(INSERT, (2, "b", 0, None, None, 7), id="too-many-parameters"),
    pytest.param(INSERT, (2, "\ud800", 0, None, None), id="surrogate-in-text"),
    pytest.param(INSERT + "; SELECT 1", (2, "b", 0, None, None), id="two-statements"),
    pytest.param(INSERT + "\x00", (2, "b", 0, None, None), id="nul-in-sql"),
]


@pytest.fixture
def reference(tmp_path):
    conn = sqlite3.connect(tmp_path / "reference.db", isolation_level=None)
    conn.executescript(SCHEMA)
    yield conn
    conn.close()


async def native_writer(tmp_path) -> GroupCommitWriter:
    path = tmp_path / "native.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA)
    return GroupCommitWriter(path, ("journal_mode = WAL",), busy_timeout_s=1)


@pytest.mark.parametrize(("sql", "params"), FAILING)
async def test_a_failing_write_raises_what_sqlite3_raises_and_the_batch_goes_on(
    tmp_path, reference, sql, params
):
    with pytest.raises(Exception) as raised:  # compared below, whatever it is
        reference.execute(sql, params)
    expected = raised.value
    writer = await native_writer(tmp_path)
    outcomes = await asyncio.gather(
        writer.execute(INSERT, (10, "before", 0, b"\x00\x01", 1.5)),
        writer.execute(sql, params),
        writer.execute(INSERT, (11, "after", 0, None, None)),
        return_exceptions=True,
    )
    await writer.close()
    error = outcomes[1]
    assert type(error) is type(expected)
    assert str(error) == str(expected)
    assert getattr(error, "sqlite_errorcode", None) == getattr(expected, "sqlite_errorcode", None)
    assert getattr(error, "sqlite_errorname", None) == getattr(expected, "sqlite_errorname", None)
    assert outcomes[0] == outcomes[2] == 1
    with sqlite3.connect(tmp_path / "native.db") as conn:
        rows = conn.execute("SELECT id, name, n, data, x FROM t ORDER BY id").fetchall()
    assert rows == [(1, "taken", 1, None, None), (10, "before", 0, b"\x00\x01", 1.5),
                    (11, "after", 0, None, None)]  # fmt: skip


async def test_rowcounts_are_those_of_sqlite3(tmp_path, reference):
    statements = [
        ("UPDATE t SET n = n + 1 WHERE id >= ?", (0,)),
        ("UPDATE t SET n = n + 1 WHERE id = ?", (99,)),
        ("CREATE TABLE IF NOT EXISTS other (a)", ()),  # not DML: -1, not the last count
        ("DELETE FROM t WHERE name = ?", ("taken",)),
        (INSERT + "; -- a comment after the statement", (60, "c", 0, None, None)),
        ("INSERT INTO t (id, name, data) VALUES (?, ?, ?)", (61, "d", bytearray(b"\x01\x02"))),
        ("INSERT INTO t (id, name, data) VALUES (?, ?, ?)", (62, "e", memoryview(b"\x03"))),
    ]
    writer = await native_writer(tmp_path)
    for sql, params in statements:
        assert await writer.execute(sql, params) == reference.execute(sql, params).rowcount
    await writer.close()


async def test_a_unit_is_all_or_nothing_and_its_error_is_its_first_failing_statement(tmp_path):
    writer = await native_writer(tmp_path)
    failed, done = await asyncio.gather(
        writer.execute_unit([
            (INSERT, [(20, "u1", 0, None, None), (21, "u2", 0, None, None)]),
            ("UPDATE t SET n = ? WHERE id = ?", [(5, 1)]),
            (INSERT, [(22, "forbidden", 0, None, None)]),
        ]),
        writer.execute_unit([(INSERT, [(30, "v1", 0, None, None), (31, "v2", 0, None, None)])]),
        return_exceptions=True,
    )  # fmt: skip
    await writer.close()
    assert isinstance(failed, sqlite3.IntegrityError)
    assert str(failed) == "name_forbidden"
    assert failed.sqlite_errorname == "SQLITE_CONSTRAINT_TRIGGER"
    assert done is None
    with sqlite3.connect(tmp_path / "native.db") as conn:
        rows = conn.execute("SELECT id, n FROM t ORDER BY id").fetchall()
    assert rows == [(1, 1), (30, 0), (31, 0)]


async def test_a_statement_that_cannot_be_prepared_fails_the_whole_batch(tmp_path):
    writer = await native_writer(tmp_path)
    outcomes = await asyncio.gather(
        writer.execute(INSERT, (40, "w", 0, None, None)),
        writer.execute("INSERT INTO missing VALUES (?)", (1,)),
        return_exceptions=True,
    )
    await writer.close()
    assert all(isinstance(o, sqlite3.OperationalError) for o in outcomes)
    assert str(outcomes[1]) == "no such table: missing"
    with sqlite3.connect(tmp_path / "native.db") as conn:
        assert conn.execute("SELECT count(*) FROM t WHERE id = 40").fetchone() == (0,)


async def test_text_and_blobs_round_trip_byte_for_byte(tmp_path):
    writer = await native_writer(tmp_path)
    name = "snow ☃ \x00 and nul"
    data = bytes(range(256)) * 64
    assert await writer.execute(INSERT, (50, name, 0, data, -0.25)) == 1
    await writer.close()
    with sqlite3.connect(tmp_path / "native.db") as conn:
        row = conn.execute("SELECT name, data, x FROM t WHERE id = 50").fetchone()
    assert row == (name, data, -0.25)


BUMP = "UPDATE t SET n = n + ? WHERE id = 1 -- distinct text: "


async def test_many_distinct_statements_keep_working_past_the_statement_cache(tmp_path):
    writer = await native_writer(tmp_path)
    for i in range(600):  # the cache starts over past 256 statements, between batches
        await asyncio.gather(
            writer.execute(BUMP + str(i), (1,)),
            writer.execute(BUMP + str(i % 7), (2,)),
        )
    await writer.close()
    with sqlite3.connect(tmp_path / "native.db") as conn:
        assert conn.execute("SELECT n FROM t WHERE id = 1").fetchone() == (1 + 600 * 3,)


async def test_a_statement_that_ends_the_transaction_fails_the_whole_batch(tmp_path):
    writer = await native_writer(tmp_path)
    outcomes = await asyncio.gather(
        writer.execute(INSERT, (70, "before", 0, None, None)),
        writer.execute(INSERT, (71, "roll back", 0, None, None)),  # RAISE(ROLLBACK)
        writer.execute(INSERT, (72, "after", 0, None, None)),
        return_exceptions=True,
    )
    await writer.close()
    assert [type(o) for o in outcomes] == [sqlite3.IntegrityError] * 3
    assert all(o.sqlite_errorname == "SQLITE_CONSTRAINT_TRIGGER" for o in outcomes)
    with sqlite3.connect(tmp_path / "native.db") as conn:  # nothing of it committed
        assert conn.execute("SELECT count(*) FROM t WHERE id >= 70").fetchone() == (0,)


async def test_a_returning_clause_neither_fails_the_batch_nor_keeps_its_rows(tmp_path):
    writer = await native_writer(tmp_path)
    returned, after = await asyncio.gather(
        writer.execute(INSERT + " RETURNING id", (80, "r", 0, None, None)),
        writer.execute(INSERT, (81, "s", 0, None, None)),
    )
    await writer.close()
    assert (returned, after) == (1, 1)


def test_a_writer_that_never_opened_is_freed_without_harm():
    with pytest.raises(TypeError):
        Writer(1, 2)
    Writer.__new__(Writer).close()


def test_python_code_run_while_a_batch_is_copied_cannot_overrun_it(tmp_path):
    """A str subclass runs Python code when the statement cache hashes it: here, code that
    lengthens a unit further in the batch, after the batch's steps were counted. The batch
    fails; nothing is written past the end of what was counted."""
    sqlite3.connect(tmp_path / "w.db").executescript(SCHEMA)
    writer = Writer(str(tmp_path / "w.db"), ())
    unit = [(INSERT, [(89, "g", 0, None, None)])]

    class Growing(str):
        def __hash__(self):
            unit.extend((INSERT, [(90 + i, "g", 0, None, None)]) for i in range(50))
            return str.__hash__(self)

    with pytest.raises(SystemError, match="grew"):
        writer.run([(Growing(INSERT), (87, "f", 0, None, None)), ("-- unit", unit)])
    assert writer.run([(INSERT, (88, "h", 0, None, None))]) == [1]
    writer.close()
