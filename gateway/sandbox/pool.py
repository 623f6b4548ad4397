"""The deployment's sandbox nodes (`[sandbox_node]` and `[[sandbox_nodes]]`): each with its
own slots, signed session and health.

An execution goes to the healthy node with the most free slots (the first of equals);
the capacity is the sum of the nodes' `max_concurrent`. A node is down from the moment a
call to it got no answer (refused, broken, timed out) or its health check failed (GET
/healthz: no 200 within HEALTH_TIMEOUT_S, or a node that refuses to execute), and is
skipped until a check passes again. Every node is checked every HEALTH_INTERVAL_S in
the background, so a dead node costs requests nothing, not even a connection attempt.

A node's slot count is the gateway's side of the node's own: taken before the call,
freed when the node answered (or the call was given up, which closes its connection and
so frees the node's slot too).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Literal

import aiohttp

from model_gateway.gateway.cluster.background import stop_tasks
from model_gateway.gateway.config import Config, ConfigError, SandboxNodeConfig, SandboxNodeEntry
from model_gateway.gateway.sandbox.client import (
    NodeUnreachable,
    execute_on_node,
    node_healthy,
    stop_on_node,
)
from model_gateway.gateway.sandbox.supervisor import NodeSupervisor
from model_gateway.gateway.sandbox.wire_auth import Signer, load_shared_secret

log = logging.getLogger("gateway.sandbox")

HEALTH_INTERVAL_S = 2.0
HEALTH_TIMEOUT_S = 2.0


class SandboxNode:
    """One node: its slots, its session, its health, and (spawn = true) its supervisor."""

    def __init__(
        self,
        name: str,
        entry: SandboxNodeEntry,
        secret_file: Path,
        log_format: Literal["text", "json"] = "text",
    ) -> None:
        self.name = name  # its place in the config: never its address, which stays private
        self.url = entry.url.rstrip("/")
        self.max_concurrent = entry.max_concurrent
        self.in_use = 0
        self.down_because: str | None = None  # None: healthy, until a call or check says not
        self._secret_file = secret_file
        self._signer: Signer | None = None
        self._session: aiohttp.ClientSession | None = None
        self._supervisor: NodeSupervisor | None = None
        if isinstance(entry, SandboxNodeConfig) and entry.spawn:
            # Binds the node's port now: a taken one stops `gateway serve` at once.
            self._supervisor = NodeSupervisor(
                self.url, secret_file, max_concurrent=self.max_concurrent, log_format=log_format
            )

    @property
    def healthy(self) -> bool:
        return self.down_because is None

    @property
    def free(self) -> int:
        return self.max_concurrent - self.in_use

    def state(self) -> dict[str, object]:
        return {
            "status": "up" if self.healthy else "down",
            "slots": self.max_concurrent,
            "in_use": self.in_use,
        }

    async def start(self) -> None:
        self._signer = Signer(load_shared_secret(self._secret_file))
        # A connection per slot, one per slot for a stop request sent while its run holds
        # the first, one for the health check, and two spare: a slot's connection may
        # still be closing when reused.
        connector = aiohttp.TCPConnector(limit=2 * self.max_concurrent + 3)
        self._session = aiohttp.ClientSession(connector=connector)
        if self._supervisor is not None:
            await self._supervisor.start()  # NodeStartError: `gateway serve` does not start

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._supervisor is not None:
            await self._supervisor.stop()
            self._supervisor = None

    async def execute(self, job: dict[str, Any]) -> dict[str, object]:
        """The node's verified answer; NodeError (NodeUnreachable marks the node down)."""
        assert self._session is not None and self._signer is not None
        try:
            return await execute_on_node(self._session, self.url, self._signer, job)
        except NodeUnreachable as exc:
            self._mark(str(exc))
            raise

    async def stop(self, execution_id: str) -> str:
        assert self._session is not None and self._signer is not None
        return await stop_on_node(self._session, self.url, self._signer, execution_id)

    async def check(self) -> None:
        assert self._session is not None
        self._mark(await node_healthy(self._session, self.url, HEALTH_TIMEOUT_S))

    def _mark(self, down_because: str | None) -> None:
        if down_because is not None and self.healthy:
            log.warning("sandbox node %s is down, skipped until it recovers: %s",
                        self.name, down_because)  # fmt: skip
        elif down_because is None and not self.healthy:
            log.info("sandbox node %s is back", self.name)
        self.down_because = down_because


class NodePool:
    """Every configured node (none: sandboxes are not configured), and their health checks."""

    def __init__(self, config: Config) -> None:
        self.nodes: list[SandboxNode] = []
        try:
            for name, entry in config.sandbox_node_entries():
                secret_file = config.path(entry.secret_file)
                log_format = config.server.log_format  # a spawned node logs as the gateway
                self.nodes.append(SandboxNode(name, entry, secret_file, log_format))
        except ValueError as exc:  # a spawned node's url: not an http URL
            raise ConfigError(str(exc)) from None
        self._checks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        try:
            for node in self.nodes:
                await node.start()
        except BaseException:
            await self.close()
            raise
        self._checks = [asyncio.create_task(self._keep_checking(node)) for node in self.nodes]

    async def close(self) -> None:
        await stop_tasks(*self._checks)
        self._checks = []
        for node in self.nodes:
            await node.close()

    def choose(self, tried: set[SandboxNode]) -> SandboxNode | None:
        """The healthy node not yet tried with the most free slots; None when none is free."""
        free = [n for n in self.nodes if n.healthy and n.free > 0 and n not in tried]
        return max(free, key=lambda node: node.free, default=None)  # max: the first of equals

    def any_healthy(self) -> bool:
        return any(node.healthy for node in self.nodes)

    def states(self) -> dict[str, dict[str, object]]:
        return {node.name: node.state() for node in self.nodes}

    @staticmethod
    async def _keep_checking(node: SandboxNode) -> None:
        while True:
            await node.check()
            await asyncio.sleep(HEALTH_INTERVAL_S)
