from __future__ import annotations

import pytest

from tests.support.gateway_process import GatewayProcess


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "postgres: needs a PostgreSQL server (skipped only when none listens)"
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
