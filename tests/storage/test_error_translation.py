"""Driver errors become StorageError in one place: the `Storage` base class wraps every
public coroutine method of a backend, and the backend's `translate_error` hook refines
the few it raises on purpose (LimitReached, StateConflict). No backend method catches its
driver's exceptions by hand."""

from __future__ import annotations

import ast
import asyncio
import builtins
import importlib
import inspect
import pkgutil
import sqlite3
import textwrap
import time
from pathlib import Path

import pytest

import model_gateway.storage as storage_package
from model_gateway.storage import (
    LimitReached,
    ProjectRecord,
    ReservationRecord,
    StateConflict,
    Storage,
    StorageError,
    open_storage,
)
from model_gateway.storage.base import KeyRecord
from model_gateway.storage.sqlite import SQLiteStorage

HOOK = "translate_error"


def _backends() -> list[type[Storage]]:
    """Every concrete Storage subclass defined in a module of the storage package."""
    found = []
    for info in pkgutil.iter_modules(storage_package.__path__):
        module = importlib.import_module(f"{storage_package.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            defined_here = cls.__module__ == module.__name__
            if issubclass(cls, Storage) and cls is not Storage and defined_here:
                found.append(cls)
    return found


BACKEND_CLASSES = _backends()


def test_the_sqlite_backend_is_among_the_checked_ones():
    assert SQLiteStorage in BACKEND_CLASSES


def test_the_postgresql_backend_is_among_the_checked_ones():
    from model_gateway.storage.postgres import PostgresStorage

    assert PostgresStorage in BACKEND_CLASSES


def _resolve(node: ast.expr, namespace: dict) -> list[type[BaseException]] | None:
    """The exception classes an `except` clause names, resolved in the module's namespace."""
    if isinstance(node, ast.Tuple):
        resolved: list[type[BaseException]] = []
        for element in node.elts:
            part = _resolve(element, namespace)
            if part is None:
                return None
            resolved.extend(part)
        return resolved
    try:
        value = eval(compile(ast.Expression(node), "<except>", "eval"), dict(namespace))  # noqa: S307
    except Exception:
        return None
    if isinstance(value, tuple):
        return list(value)
    return [value] if isinstance(value, type) else None


def _translates_by_hand(handler: ast.ExceptHandler, namespace: dict, driver: tuple) -> bool:
    if handler.type is None:  # a bare except catches the driver's errors too
        caught: list[type[BaseException]] | None = [BaseException]
    else:
        caught = _resolve(handler.type, namespace)
    if caught is None:
        return True  # cannot tell what it catches: refuse rather than miss a translation
    reraises = (
        bool(handler.body)
        and isinstance(handler.body[-1], ast.Raise)
        and (handler.body[-1].exc is None)
    )
    for cls in caught:
        if any(issubclass(cls, d) for d in driver):
            return True  # names a driver exception (sqlite3.*, aiosqlite.*, ...)
        if any(issubclass(d, cls) for d in driver) and not reraises:
            return True  # Exception, BaseException: swallows driver errors unless re-raised
    return False


def backend_parts(cls: type[Storage]) -> list[type[Storage]]:
    """The classes a backend is made of: itself and every Storage subclass it inherits
    from (a backend is the union of a class per domain, each in a module of its own)."""
    return [part for part in cls.__mro__ if issubclass(part, Storage) and part is not Storage]


def hand_translations(cls: type[Storage]) -> list[str]:
    """`except` clauses inside the methods of the backend's classes (the hook excepted)
    that catch one of its driver exceptions."""
    driver = tuple(cls.base_exceptions)
    found = []
    for part in backend_parts(cls):
        module = inspect.getmodule(part)
        source = Path(inspect.getsourcefile(part)).read_text()
        tree = ast.parse(source)
        namespace = {**vars(builtins), **vars(module)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ClassDef) and node.name == part.__name__):
                continue
            for method in node.body:
                if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                if method.name == HOOK:
                    continue
                for inner in ast.walk(method):
                    if isinstance(inner, ast.ExceptHandler) and _translates_by_hand(
                        inner, namespace, driver
                    ):
                        clause = ast.unparse(inner.type) if inner.type else "(bare)"
                        found.append(f"{part.__name__}.{method.name}: except {clause}")
    return found


@pytest.mark.parametrize("backend", BACKEND_CLASSES, ids=lambda c: c.__name__)
def test_the_check_reads_every_domain_class_of_a_backend(backend):
    """The backend class itself defines no method: the check must read the classes it is
    the union of, one per domain module, and the connections' class they share."""
    modules = {part.__module__.rsplit(".", 1)[-1] for part in backend_parts(backend)}
    domains = {"accounts", "ledger", "log", "console", "agents", "cluster", "connection"}
    assert domains <= modules


@pytest.mark.parametrize("backend", BACKEND_CLASSES, ids=lambda c: c.__name__)
def test_no_backend_method_translates_driver_errors_by_hand(backend):
    assert backend.base_exceptions, f"{backend.__name__} declares no driver exceptions"
    assert hand_translations(backend) == []


def test_the_checker_catches_a_hand_translation():
    """The check above must be able to fail: a backend written the old way is caught."""
    code = textwrap.dedent(
        """
        import sqlite3
        import aiosqlite
        from model_gateway.storage.base import Storage, StorageError

        class HandMade(Storage):
            base_exceptions = (sqlite3.Error, ValueError)

            async def get_thing(self):
                try:
                    return 1
                except sqlite3.IntegrityError as exc:
                    raise StorageError(str(exc)) from None

            async def other(self):
                try:
                    return 2
                except (aiosqlite.Error, ValueError):
                    raise StorageError("x") from None

            async def swallow(self):
                try:
                    return 3
                except Exception:
                    return None

            async def fine(self):
                try:
                    return 4
                except BaseException:
                    raise

            @classmethod
            def translate_error(cls, exc, operation):
                try:
                    return StorageError(operation)
                except sqlite3.Error:
                    raise
        """
    )
    namespace = {"sqlite3": sqlite3, "aiosqlite": importlib.import_module("aiosqlite")}
    driver = (sqlite3.Error, ValueError)
    tree = ast.parse(code)
    flagged = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for method in node.body:
                if isinstance(method, ast.AsyncFunctionDef | ast.FunctionDef) and (
                    method.name != HOOK
                ):
                    for inner in ast.walk(method):
                        if isinstance(inner, ast.ExceptHandler) and _translates_by_hand(
                            inner, {**vars(builtins), **namespace}, driver
                        ):
                            flagged.add(method.name)
    assert flagged == {"get_thing", "other", "swallow"}


@pytest.mark.parametrize("backend", BACKEND_CLASSES, ids=lambda c: c.__name__)
def test_every_public_coroutine_method_is_wrapped(backend):
    public = [
        name
        for name, member in inspect.getmembers(backend)
        if not name.startswith("_") and inspect.iscoroutinefunction(member)
    ]
    assert {"open", "settle", "reserve", "get_project", "append_log_tiles"} <= set(public)
    unwrapped = [
        name for name in public if not getattr(getattr(backend, name), "__translates__", False)
    ]
    assert unwrapped == []


# Real driver failures, on real files.

MONTH = "2026-11"


def key(project_id: str, prefix: str) -> KeyRecord:
    return KeyRecord(
        id=f"key_{prefix}_{time.monotonic_ns()}",
        prefix=prefix,
        key_hash=b"h",
        project_id=project_id,
        scopes=frozenset({"inference"}),
    )


def hold(rid: str, amount: int = 10) -> ReservationRecord:
    return ReservationRecord(
        id=rid,
        project_id="prj_e",
        key_id=None,
        amount=amount,
        month=MONTH,
        owner="t:1:1",
        lease_until=2**40,
        created_at=0,
    )


async def test_a_closed_storage_raises_storage_error_on_reads_and_writes(tmp_path):
    store = await open_storage(f"sqlite:///{tmp_path / 'e.db'}")
    await store.create_project(ProjectRecord(id="prj_e", name="e"))
    await store.close()
    with pytest.raises(StorageError) as read:
        await store.get_project("prj_e")
    assert not isinstance(read.value, ValueError | sqlite3.Error)
    with pytest.raises(StorageError):
        await store.reserve(hold("rsv_closed"))
    with pytest.raises(StorageError):
        await store.create_project(ProjectRecord(id="prj_f", name="f"))
    with pytest.raises(StorageError):
        await store.health()


async def test_a_database_locked_past_the_busy_timeout_is_a_storage_error(tmp_path):
    path = tmp_path / "locked.db"
    store = await SQLiteStorage.open(f"sqlite:///{path}", busy_timeout_s=0.2)
    try:
        await store.create_project(ProjectRecord(id="prj_e", name="e"))
        await store.add_credit("prj_e", 1_000, MONTH)
        other = sqlite3.connect(path, isolation_level=None)  # another process, e.g. the CLI
        other.execute("BEGIN IMMEDIATE")
        try:
            started = time.monotonic()
            # The group-commit path (single statements of the request path) ...
            with pytest.raises(StorageError) as on_writer:
                await asyncio.wait_for(store.reserve(hold("rsv_locked")), 10)
            # ... and the aiosqlite path (read-then-decide admin transactions) both give up.
            with pytest.raises(StorageError) as on_admin:
                await asyncio.wait_for(store.create_key(key("prj_e", "proj_live_locked")), 10)
            assert time.monotonic() - started < 5
        finally:
            other.execute("ROLLBACK")
            other.close()
        for raised in (on_writer.value, on_admin.value):
            assert type(raised) is StorageError
            assert "SQLITE_BUSY" in str(raised)
        # Nothing of either write happened; the storage works again once the lock is gone.
        assert (await store.project_account("prj_e", MONTH)).reserved == 0
        assert await store.get_key("proj_live_locked") is None
        await store.reserve(hold("rsv_after"))
        assert (await store.project_account("prj_e", MONTH)).reserved == 10
    finally:
        await store.close()


async def test_trigger_and_constraint_failures_keep_their_specific_errors(tmp_path):
    store = await open_storage(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        await store.create_project(ProjectRecord(id="prj_e", name="e"))
        await store.add_credit("prj_e", 5, MONTH)
        with pytest.raises(LimitReached) as refused:
            await store.reserve(hold("rsv_big", amount=6))
        assert refused.value.reason == "insufficient_balance"
        await store.create_key(key("prj_e", "proj_live_dup"))
        with pytest.raises(StateConflict) as twin:
            await store.create_key(key("prj_e", "proj_live_dup"))
        with pytest.raises(StateConflict) as again:
            await store.create_project(ProjectRecord(id="prj_e", name="again"))
        for raised in (twin.value, again.value):
            message = str(raised)
            assert "INSERT" not in message.upper() and "api_keys" not in message
            assert "SQLITE_CONSTRAINT" in message
    finally:
        await store.close()


async def test_a_file_that_is_not_a_database_is_a_storage_error(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a SQLite database, just some bytes" * 100)
    with pytest.raises(StorageError):
        await open_storage(f"sqlite:///{path}")


async def test_a_folder_that_cannot_be_created_is_a_storage_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StorageError):
        await open_storage(f"sqlite:///{blocker / 'data' / 'gateway.db'}")
