"""Agents over real parts: an in-process `Gateway` (its real storage file, meter, echo
provider, /v1 endpoints and engine) on a real `gateway sandbox-node` process."""

from __future__ import annotations

import contextlib

import pytest

from tests.agents.support import NODE_SLOTS, AgentGateway
from tests.sandbox_e2e.helpers import NodeProcess, executing_node, running_node


@pytest.fixture(scope="session")
def node(tmp_path_factory):
    with running_node(tmp_path_factory.mktemp("agents-node"), NODE_SLOTS) as process:
        yield process


@pytest.fixture(scope="session")
def executing(node) -> NodeProcess:
    return executing_node(node)


@pytest.fixture
async def make_gateway(tmp_path, executing):
    """make_gateway(lease_s=...) -> a started in-process gateway, stopped after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(**options) -> AgentGateway:
            folder = tmp_path / f"gw{len(stack._exit_callbacks)}"
            gateway = AgentGateway(folder, executing, **options)
            await gateway.start()
            stack.push_async_callback(gateway.stop)
            return gateway

        yield make


@pytest.fixture
async def gw(make_gateway) -> AgentGateway:
    return await make_gateway()
