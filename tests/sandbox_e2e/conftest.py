"""Real processes only: `gateway sandbox-node` and `gateway serve`, each in its own process,
spoken to over loopback HTTP and administered through the real CLI."""

from __future__ import annotations

import contextlib

import pytest

from tests.sandbox_e2e.helpers import NodeProcess, executing_node, running_node, sandbox_config
from tests.support.gateway_process import GatewayProcess


@pytest.fixture(scope="session")
def node(tmp_path_factory):
    """One real node with a single slot, shared by the execution tests."""
    with running_node(tmp_path_factory.mktemp("node"), 1) as process:
        yield process


@pytest.fixture(scope="session")
def executing(node) -> NodeProcess:
    return executing_node(node)


@pytest.fixture(scope="session")
def make_gateway(tmp_path_factory):
    """make_gateway(extra_config) -> a started GatewayProcess, stopped at session end."""
    with contextlib.ExitStack() as stack:

        def make(extra_config: str) -> GatewayProcess:
            folder = tmp_path_factory.mktemp("gateway")
            return stack.enter_context(GatewayProcess(folder, extra_config=extra_config))

        yield make


@pytest.fixture(scope="session")
def sandbox_gateway(executing, make_gateway) -> GatewayProcess:
    """A gateway on the shared node, one execution in flight at most."""
    return make_gateway(sandbox_config(executing.url, executing.secret_file, max_concurrent=1))
