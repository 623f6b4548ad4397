from __future__ import annotations

import signal

import pytest
from hypothesis import settings

from tests.storage.backends import STORAGE_BACKENDS, in_ci, postgres_absent, postgres_database
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import REDIS_URL, delete_prefix, new_prefix, redis_absent

# `make test` runs 3 test processes on 2 cores beside the gateways they start: how long
# one example takes says nothing of the code there (a deadline only made CI flaky).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# With --dist loadfile a file runs whole on one worker, in collection order: the longest
# start first, or the single binary's build (about 3 minutes) runs alone at the end.
LONGEST_FIRST = (
    "tests/operations/test_single_binary.py",
    "tests/metering/test_ledger_state_machine.py",
    "tests/metering/test_leases_state_machine.py",
    "tests/sandbox/test_several_nodes.py",
    "tests/inference/test_settle_failure.py",
    "tests/console/test_browser.py",
    "tests/console/test_agents_browser.py",
    "tests/agents/test_budget_property.py",
)


def pytest_collection_modifyitems(items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "postgres: needs a PostgreSQL server (skipped only when none listens; CI=true fails)",
    )
    config.addinivalue_line(
        "markers",
        "redis: needs a Redis server (skipped only when none listens; CI=true fails)",
    )


@pytest.fixture(scope="session")
def gateway(tmp_path_factory) -> GatewayProcess:
    """One shared gateway for tests that create their own projects and keys."""
    with GatewayProcess(tmp_path_factory.mktemp("gateway")) as process:
        yield process


@pytest.fixture
def auth(gateway):
    """A fresh project with an all-scopes key: returns (project_id, key)."""
    project = gateway.create_project("auth-fixture")
    return project, gateway.create_key(project, "inference,sandboxes,receipts")


# --- storage backends: one parametrization for every storage test ----------------------


@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL database of this test run's own, dropped at its end."""
    absent = postgres_absent()
    if absent is not None:
        if in_ci():
            pytest.fail(f"CI=true and {absent}: the PostgreSQL cases must run in CI")
        pytest.skip(absent)
    # A run stopped by SIGTERM (`timeout`, CI) still drops its database: as an interrupt,
    # pytest runs the fixtures' teardown.
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with postgres_database() as url:
            yield url
    finally:
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)


@pytest.fixture(params=STORAGE_BACKENDS)
def storage_url(request, tmp_path) -> str:
    """Each backend in turn: a new SQLite file, or this run's PostgreSQL database (shared by
    the run's tests, which use fresh ids)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/storage.db"
    return request.getfixturevalue("postgres_url")


@pytest.fixture(params=STORAGE_BACKENDS)
def fresh_storage_url(request, tmp_path):
    """Like `storage_url`, but an empty database of this test's own (for global state such
    as the transparency log)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/fresh.db"
        return
    request.getfixturevalue("postgres_url")  # the server check: skip, or fail in CI
    with postgres_database() as url:
        yield url


@pytest.fixture
def fresh_postgres_url(request):
    """An empty PostgreSQL database of this test's own: several gateway processes share it."""
    request.getfixturevalue("postgres_url")  # the server check: skip, or fail in CI
    with postgres_database() as url:
        yield url


@pytest.fixture
def redis_url():
    """The test Redis and a key prefix of this test's own (its keys deleted at the end)."""
    absent = redis_absent()
    if absent is not None:
        if in_ci():
            pytest.fail(f"CI=true and {absent}: the Redis cases must run in CI")
        pytest.skip(absent)
    prefix = new_prefix()
    yield REDIS_URL, prefix
    delete_prefix(prefix)


def pytest_terminal_summary(terminalreporter):
    """Say loudly which service's cases did not run. Read from the reports, which reach
    this process from every xdist worker."""
    for marker, service in (("redis", "Redis"), ("postgres", "PostgreSQL")):
        skipped = [r for r in terminalreporter.stats.get("skipped", []) if marker in r.keywords]
        if skipped:
            longrepr = skipped[0].longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple | list) else str(longrepr)
            terminalreporter.write_sep(
                "=", f"{len(skipped)} {service} case(s) SKIPPED: {reason}", yellow=True
            )
