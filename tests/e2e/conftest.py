from __future__ import annotations

import httpx
import pytest

from tests.support.gateway_process import GatewayProcess


@pytest.fixture(scope="session")
def http(gateway: GatewayProcess):
    """A keep-alive client on the shared gateway (cookies are never kept)."""
    with httpx.Client(base_url=gateway.url, timeout=30, cookies=None) as client:
        yield client


@pytest.fixture(scope="session")
def make_key(gateway: GatewayProcess):
    """make_key(scopes, *key_options, project=(...project options)) -> (project_id, key),
    both made by the real CLI in its own process."""

    def make(scopes: str = "inference", *key_options: str, project: tuple[str, ...] = ()):
        project_id = gateway.create_project("e2e", *project)
        return project_id, gateway.create_key(project_id, scopes, *key_options)

    return make


@pytest.fixture(scope="session")
def inference_key(make_key) -> str:
    """One shared key with every live scope, for tests that only read."""
    return make_key("inference,sandboxes,receipts")[1]
