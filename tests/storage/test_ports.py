"""The storage is one port per domain (storage/ports.py) and, in each backend, one module
per domain: `Storage` is the union of the ports, every method of a backend's domain module
belongs to that domain's port, and every backend implements every port method itself."""

from __future__ import annotations

import inspect

import pytest

from model_gateway.storage import (
    AccountsPort,
    AgentsPort,
    ClusterPort,
    ConsolePort,
    LedgerPort,
    LifecyclePort,
    LogPort,
    RateLimitPort,
    Storage,
)
from model_gateway.storage.ports import AuditPort
from model_gateway.storage.postgres import PostgresStorage
from model_gateway.storage.sqlite import SQLiteStorage

DOMAINS = {
    "accounts": AccountsPort,
    "ledger": LedgerPort,
    "log": LogPort,
    "console": ConsolePort,
    "audit": AuditPort,
    "agents": AgentsPort,
    "cluster": ClusterPort,
}
PORTS = [LifecyclePort, *DOMAINS.values()]
BACKENDS = [SQLiteStorage, PostgresStorage]
# What a backend's connection module may define besides its life cycle: `open`, the one
# port method that reports on its write batches, and what the base class asks for.
CONNECTION = {"open", "writes_idle", "translate_error", "base_exceptions"}


def public(cls: type) -> set[str]:
    """The public names a class defines itself (methods and declared attributes)."""
    names = set(vars(cls)) | set(vars(cls).get("__annotations__", {}))
    return {name for name in names if not name.startswith("_")}


def test_no_method_is_in_two_ports():
    seen: dict[str, str] = {}
    for port in [*PORTS, RateLimitPort]:
        for name in public(port):
            assert name not in seen, f"{name} in {seen.get(name)} and {port.__name__}"
            seen[name] = port.__name__


def test_storage_is_the_union_of_the_ports():
    members = {name for port in PORTS for name in public(port)}
    interface = {
        name
        for name, member in inspect.getmembers(Storage)
        if not name.startswith("_") and (callable(member) or isinstance(member, bool))
    }
    assert interface - {"open", "translate_error", "base_exceptions"} == members
    assert all(port in Storage.__mro__ for port in PORTS)
    assert RateLimitPort not in Storage.__mro__  # PostgreSQL's alone


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda c: c.__name__)
def test_each_domain_module_holds_its_ports_methods_only(backend):
    package = backend.__module__
    parts = {part.__module__.removeprefix(package + "."): part for part in backend.__mro__[1:]}
    for domain, port in DOMAINS.items():
        extra = public(parts[domain]) - public(port) - public(RateLimitPort)
        assert extra == set(), f"{parts[domain].__name__} defines {extra}, not {port.__name__}'s"
    connection = public(parts["connection"]) - public(LifecyclePort) - CONNECTION
    assert connection == set()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda c: c.__name__)
def test_every_port_method_is_the_backends_own(backend):
    """Not the port's declaration (abstract, or raising NotImplementedError)."""
    inherited = [
        name
        for port in PORTS
        for name in public(port)
        if callable(getattr(port, name, None))
        and getattr(backend, name).__qualname__.split(".")[0] in {p.__name__ for p in PORTS}
    ]
    assert inherited == []
    assert not inspect.isabstract(backend)


def test_the_postgresql_backend_offers_the_shared_rate_limits():
    assert RateLimitPort in PostgresStorage.__mro__
    assert not hasattr(SQLiteStorage, "take_rate_limits")
