"""`spawn = true`: `gateway serve` runs a local sandbox node as its child and keeps it up.

The node listens where `[sandbox_node] url` points and reads the same secret file. The
gateway binds that port itself, when the app is created, and hands the listening socket
to the node. A port that is taken (another deployment's node on it) stops `gateway serve`
before it opens anything, with a message naming it, instead of a node crash-looping on
the bind while the gateway talks to whatever answers there; and a restarted node gets
the same socket, so nothing else can take the port between two runs. If the node exits,
it is started again (after 1 s, doubling up to 30 s while it keeps dying young). A node
that exits before it first answered fails the start too. At shutdown it gets SIGTERM,
then SIGKILL after a grace period. PR_SET_PDEATHSIG makes the kernel end it if the
gateway itself dies without shutting down (kill -9).

Run directly, this module is the child: `python -m gateway.sandbox.supervisor HOST PORT
SECRET_FILE MAX_CONCURRENT LOG_FORMAT [LISTENING_FD]`. It logs in the gateway's
`log_format`, on the gateway's stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import aiohttp
import anyio

from model_gateway.gateway.cluster.background import stop_child, stop_tasks
from model_gateway.gateway.config import ConfigError
from model_gateway.gateway.ops.children import SANDBOX_NODE_ARG, child_command, die_with_parent

log = logging.getLogger("model_gateway.gateway.sandbox.supervisor")

READY_WAIT_S = 15.0
STOP_GRACE_S = 10.0
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 60.0  # a node that ran this long before dying restarts without delay growth


def node_address(url: str) -> tuple[str, int]:
    """Host and port a node serving `url` listens on."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"[sandbox_node] url is not an http URL: {url!r}")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


class NodeStartError(RuntimeError):
    """The spawned node exited before it could serve: `gateway serve` does not start."""


class NodePortTaken(ConfigError):
    """The node's port is taken: `gateway serve` stops before it opens anything else."""


def listen(host: str, port: int) -> socket.socket:
    """The node's listening socket, bound here so that a taken port fails the start."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn binds
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise NodePortTaken(
            f"the sandbox node cannot listen on {host}:{port} ([sandbox_node] url): "
            f"{exc.strerror or exc}. Is another deployment's node using this port? "
            "Give each deployment with spawn = true its own port."
        ) from None


class NodeSupervisor:
    """Binds the node's port on creation (NodePortTaken), runs the node from `start`."""

    def __init__(
        self,
        url: str,
        secret_file: Path,
        *,
        max_concurrent: int,
        log_format: Literal["text", "json"] = "text",
    ) -> None:
        self.url = url.rstrip("/")
        self.host, self.port = node_address(url)
        self.argv = [
            *child_command(SANDBOX_NODE_ARG),
            self.host,
            str(self.port),
            str(secret_file),
            str(max_concurrent),
            log_format,
        ]
        self.process: asyncio.subprocess.Process | None = None
        self._socket: socket.socket | None = listen(self.host, self.port)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    async def start(self) -> None:
        """Starts the node and waits (a bounded time) until it answers its health check;
        raises NodeStartError if the node exits first."""
        try:
            await self._spawn()
            ready = await self._wait_ready()
        except BaseException:
            await self.stop()
            raise
        if ready is None:
            assert self.process is not None  # spawned: _wait_ready saw it exit
            code = self.process.returncode
            await self.stop()
            raise NodeStartError(f"the sandbox node exited with {code} before it could serve")
        self._task = asyncio.create_task(self._keep_running())
        if not ready:
            log.warning("sandbox node not ready after %.0f s; executions answer 502", READY_WAIT_S)

    async def stop(self) -> None:
        self._stopping = True
        with anyio.CancelScope(shield=True):
            await stop_tasks(self._task)
        await stop_child(self.process, STOP_GRACE_S)
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def _spawn(self) -> None:
        assert self._socket is not None
        fd = self._socket.fileno()
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            str(fd),
            stdin=asyncio.subprocess.DEVNULL,
            pass_fds=(fd,),
            preexec_fn=die_with_parent,
        )
        log.info("sandbox node started: pid %d serving %s", self.process.pid, self.url)

    async def _keep_running(self) -> None:
        backoff = FIRST_BACKOFF_S
        while not self._stopping:
            started = time.monotonic()
            assert self.process is not None  # spawned before this task starts, and after each exit
            code = await self.process.wait()
            if self._stopping:
                return
            if time.monotonic() - started > STABLE_AFTER_S:
                backoff = FIRST_BACKOFF_S
            log.error("sandbox node exited with %s; restarting in %.0f s", code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
            await self._spawn()

    async def _wait_ready(self) -> bool | None:
        """True once the node answers; False after READY_WAIT_S; None if it exited first."""
        process = self.process
        assert process is not None  # _spawn came first
        deadline = time.monotonic() + READY_WAIT_S
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if process.returncode is not None:
                    return None
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    timeout = aiohttp.ClientTimeout(total=1)
                    async with session.get(f"{self.url}/healthz", timeout=timeout) as response:
                        if response.status == 200:
                            return True
                await asyncio.sleep(0.05)
        return False


def run_child(argv: list[str]) -> None:
    from model_gateway.gateway.ops.logs import configure_logging
    from model_gateway.gateway.sandbox.node.service import serve_node

    host, port, secret_file, max_concurrent, log_format, *fd = argv
    configure_logging("json" if log_format == "json" else "text")
    serve = serve_node(
        host,
        int(port),
        secret_file,
        max_concurrent=int(max_concurrent),
        fd=int(fd[0]) if fd else None,
    )
    asyncio.run(serve)


if __name__ == "__main__":
    run_child(sys.argv[1:])
