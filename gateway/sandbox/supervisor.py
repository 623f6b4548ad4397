"""`spawn = true`: `gateway serve` runs a local sandbox node as its child and keeps it up.

The node listens where `[sandbox_node] url` points and reads the same secret file. If it
exits, it is started again (after 1 s, doubling up to 30 s while it keeps dying young).
At shutdown it gets SIGTERM, then SIGKILL after a grace period. PR_SET_PDEATHSIG makes
the kernel end it if the gateway itself dies without shutting down (kill -9).

Run directly, this module is the child: `python -m gateway.sandbox.supervisor HOST PORT
SECRET_FILE MAX_CONCURRENT`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import anyio

log = logging.getLogger("gateway.sandbox.supervisor")

READY_WAIT_S = 15.0
STOP_GRACE_S = 10.0
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 60.0  # a node that ran this long before dying restarts without delay growth
_PR_SET_PDEATHSIG = 1


def node_address(url: str) -> tuple[str, int]:
    """Host and port a node serving `url` listens on."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"[sandbox_node] url is not an http URL: {url!r}")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class NodeSupervisor:
    def __init__(self, url: str, secret_file: Path, *, max_concurrent: int) -> None:
        self.url = url.rstrip("/")
        host, port = node_address(url)
        self.argv = [
            sys.executable,
            "-m",
            "gateway.sandbox.supervisor",
            host,
            str(port),
            str(secret_file),
            str(max_concurrent),
        ]
        self.process: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    async def start(self) -> None:
        """Starts the node and waits (a bounded time) until it answers its health check."""
        await self._spawn()
        self._task = asyncio.create_task(self._keep_running())
        if not await self._wait_ready():
            log.warning("sandbox node not ready after %.0f s; executions answer 502", READY_WAIT_S)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(self._task, return_exceptions=True)
        process = self.process
        if process is None or process.returncode is not None:
            return
        with anyio.CancelScope(shield=True):
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), STOP_GRACE_S)
            except TimeoutError:
                process.kill()
                await process.wait()

    async def _spawn(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        log.info("sandbox node started: pid %d serving %s", self.process.pid, self.url)

    async def _keep_running(self) -> None:
        backoff = FIRST_BACKOFF_S
        while not self._stopping:
            started = time.monotonic()
            code = await self.process.wait()
            if self._stopping:
                return
            if time.monotonic() - started > STABLE_AFTER_S:
                backoff = FIRST_BACKOFF_S
            log.error("sandbox node exited with %s; restarting in %.0f s", code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
            await self._spawn()

    async def _wait_ready(self) -> bool:
        deadline = time.monotonic() + READY_WAIT_S
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    timeout = aiohttp.ClientTimeout(total=1)
                    async with session.get(f"{self.url}/healthz", timeout=timeout) as response:
                        if response.status == 200:
                            return True
                await asyncio.sleep(0.05)
        return False


def _main(argv: list[str]) -> None:
    from gateway.sandbox.node import serve_node

    host, port, secret_file, max_concurrent = argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve_node(host, int(port), secret_file, max_concurrent=int(max_concurrent)))


if __name__ == "__main__":
    _main(sys.argv[1:])
