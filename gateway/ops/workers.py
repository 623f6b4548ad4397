"""`gateway serve --workers N` (`[server] workers`; decisions.md, "Every core of one box"):
N processes serve one listening socket and one database; this parent serves nothing.

The parent binds the port once and starts the workers (gateway/ops/worker.py) through the
children's mechanism (gateway/ops/children.py: the single binary starts itself again),
each inheriting the socket: the kernel hands each new connection to one of them. Every
guarantee of several instances holds among them, because each worker is one: its own
holds, leases and instance lease in the shared database, revocation seen at its next
request (SQLite's epoch file), one log sequencer (the lock), a dead worker's holds
released by the others' sweeps. What needs more than the database is in the run folder
(gateway/ops/worker_seat.py): the rate limits' buckets on SQLite, and each worker's
metrics, which whichever worker serves `/metrics` adds up.

The parent owns what there must be one of: a spawned sandbox node and the log process
(the workers then run neither), and the start-up summary, printed once. It restarts a
worker that exits (after `RESTART_BACKOFF_S`, doubled while restarts keep failing fast,
up to `RESTART_BACKOFF_MAX_S`). SIGTERM or SIGINT: it passes the signal to every worker,
each stops accepting and finishes its in-flight requests and streams (uvicorn's graceful
shutdown), and the parent exits once all are gone, after its log process logged every
receipt. The workers die with it however it dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import orjson

from model_gateway.gateway.cluster.background import stop_child
from model_gateway.gateway.config import Config, ConfigError, SandboxNodeConfig
from model_gateway.gateway.ops.children import WORKER_ARG, child_command, die_with_parent
from model_gateway.gateway.ops.metrics_text import Gauge, Registry
from model_gateway.gateway.ops.secretfile import load_or_create_secret
from model_gateway.gateway.ops.server import prepare_to_serve
from model_gateway.gateway.ops.summary import console_url, listen_url, startup_summary
from model_gateway.gateway.ops.worker import READY, config_builtins
from model_gateway.gateway.ops.worker_seat import METRICS_SUFFIX, WorkerSeat, serve_samples
from model_gateway.gateway.ratelimit.shared_gcra import create_table

if TYPE_CHECKING:
    from model_gateway.gateway.proofs.log_process import LogProcess

log = logging.getLogger("gateway")

READY_WAIT_S = 60.0  # a worker's start: migrations, secrets, the providers' sessions
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
RAN_WELL_S = 60.0  # a worker that served this long before it died is restarted at once
KILL_GRACE_S = 5.0  # at a start-up failure, the others' time to stop before SIGKILL
BACKLOG = 2048  # uvicorn's default


def worker_count(configured: int) -> int:
    """`0`: one per core this process may run on."""
    return configured or len(os.sched_getaffinity(0))


def listen(host: str, port: int) -> socket.socket:
    """The one listening socket, inherited by every worker."""
    try:
        listener = socket.create_server((host, port), backlog=BACKLOG, reuse_port=False)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {listen_url(host, port)}: {exc.strerror}") from None
    listener.set_inheritable(True)
    return listener


def run_folder() -> Path:
    """A private folder for the workers' shared files, on tmpfs where there is one."""
    shm = Path("/dev/shm")  # noqa: S108 (a private folder of our own is made in it)
    where = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="gateway-", dir=where))  # 0700


class Worker:
    """One seat: the process serving it now, and the restarts after it."""

    def __init__(self, parent: Parent, index: int) -> None:
        self.parent = parent
        self.index = index
        self.process: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()

    async def start(self) -> None:
        parent = self.parent
        self.ready.clear()
        self.process = await asyncio.create_subprocess_exec(
            *child_command(WORKER_ARG),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            pass_fds=[parent.listener.fileno()],
            preexec_fn=die_with_parent,
        )
        assert self.process.stdin is not None
        settings = {
            "config": parent.worker_config,
            "fd": parent.listener.fileno(),
            "run_folder": str(parent.folder),
            "index": self.index,
        }
        self.process.stdin.write(orjson.dumps(settings) + b"\n")
        await self.process.stdin.drain()
        self.process.stdin.close()

    async def until_ready(self) -> bool:
        """Whether the worker said it serves (False: it exited, or took too long)."""
        assert self.process is not None and self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), READY_WAIT_S)
        except TimeoutError:
            return False
        if line != READY:
            return False
        self.ready.set()
        return True

    async def keep_running(self) -> None:
        """Restart the worker whenever it exits, until the parent stops."""
        backoff = RESTART_BACKOFF_S
        while True:
            assert self.process is not None
            started = time.monotonic()
            code = await self.process.wait()
            if self.parent.stopping:
                return
            if time.monotonic() - started >= RAN_WELL_S:
                backoff = RESTART_BACKOFF_S
            log.warning(
                "worker %d (pid %d) exited with %s; starting another in %.1f s",
                self.index,
                self.process.pid,
                _exit_status(code),
                backoff,
            )
            await asyncio.sleep(backoff)
            if self.parent.stopping:
                return
            backoff = min(backoff * 2, RESTART_BACKOFF_MAX_S)
            await self.start()
            if await self.until_ready():
                log.info("worker %d (pid %d) serving", self.index, self.process.pid)

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)


def _exit_status(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"


class Parent:
    def __init__(self, config: Config, listener: socket.socket, count: int) -> None:
        self.config = config
        self.listener = listener
        self.folder = run_folder()
        self.workers = [Worker(self, index) for index in range(count)]
        self.stopping = False
        self._stop = asyncio.Event()
        # Spawned nodes run here: the workers' config only names them.
        self.worker_config = config_builtins(_without_spawning(config))

    async def run(self) -> int:
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(shutil.rmtree, self.folder, ignore_errors=True)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
            await self._prepare(stack)
            try:
                await self._start_workers()
            except ConfigError as exc:
                log.error("start-up failed: %s", exc)
                await self._stop_workers(signal.SIGKILL)
                return 1
            self._announce()
            supervisors = [asyncio.create_task(w.keep_running()) for w in self.workers]
            await self._stop.wait()
            await self._stop_workers()
            for task in supervisors:
                task.cancel()
        return 0

    async def _prepare(self, stack: contextlib.AsyncExitStack) -> None:
        """What there is one of, before any worker starts: the secrets and the migrated
        database (no worker races another for them), the rate limits' table, the spawned
        sandbox nodes and the log process (which takes the log's sequencer lock first)."""
        from model_gateway.gateway.proofs.endpoints import log_origin
        from model_gateway.gateway.proofs.log_key import load_or_create_signing_key
        from model_gateway.gateway.proofs.log_process import LogProcess
        from model_gateway.gateway.sandbox.supervisor import NodeSupervisor
        from model_gateway.storage import open_storage

        config = self.config
        load_or_create_secret(config.path(config.secrets.key_pepper_file))
        load_or_create_signing_key(config.path(config.secrets.signing_key_file))
        storage = await open_storage(config.storage_url)
        await storage.close()
        create_table(WorkerSeat(self.folder, 0).limiter_file)
        for _, node in config.sandbox_node_entries():
            if isinstance(node, SandboxNodeConfig) and node.spawn:
                supervisor = NodeSupervisor(
                    node.url,
                    config.path(node.secret_file),
                    max_concurrent=node.max_concurrent,
                    log_format=config.server.log_format,
                )
                await supervisor.start()
                stack.push_async_callback(supervisor.stop)
        if config.proofs.log_process:
            child = LogProcess(
                config.storage_url,
                config.path(config.secrets.signing_key_file),
                log_origin(config),
                config.server.log_format,
            )
            await child.start()
            stack.push_async_callback(child.stop)  # after the workers: it logs every receipt
            stack.push_async_callback(await serve_samples(self._socket("parent"), _log(child)))

    def _socket(self, name: str) -> Path:
        return self.folder / f"{name}{METRICS_SUFFIX}"

    async def _start_workers(self) -> None:
        for worker in self.workers:
            await worker.start()
        ready = await asyncio.gather(*(w.until_ready() for w in self.workers))
        if not all(ready):
            raise ConfigError("a worker did not start (its log lines above say why)")

    def _announce(self) -> None:
        host, port = self.listener.getsockname()[:2]
        log.info("listening on %s", listen_url(host, port))
        log.info("console: %s", console_url(self.config, host, port))
        for line in startup_summary(self.config):
            log.info("%s", line)
        pids = ", ".join(str(w.process.pid) for w in self.workers if w.process is not None)
        log.info(
            "workers: %d serving (pids %s), run folder %s", len(self.workers), pids, self.folder
        )

    def _on_signal(self, sig: int) -> None:
        if self.stopping:
            for worker in self.workers:  # a second Ctrl-C: uvicorn then stops at once
                worker.signal(sig)
            return
        self.stopping = True
        self._stop.set()

    async def _stop_workers(self, sig: int = signal.SIGTERM) -> None:
        """Each worker stops accepting, finishes what it serves and exits; no timeout here
        (systemd's TimeoutStopSec, or a second signal, bounds it)."""
        self.stopping = True
        self.listener.close()  # the workers hold their own copies until they stop
        for worker in self.workers:
            worker.signal(sig)
        if sig == signal.SIGKILL:  # a failed start-up: nothing to drain
            await asyncio.gather(*(stop_child(w.process, KILL_GRACE_S) for w in self.workers))
        else:
            await asyncio.gather(*(_exited(w) for w in self.workers))
        log.info("workers: all stopped")


async def _exited(worker: Worker) -> None:
    if worker.process is not None:
        await worker.process.wait()


def _without_spawning(config: Config) -> Config:
    node = config.sandbox_node
    if node is None or not node.spawn:
        return config
    return msgspec.structs.replace(config, sandbox_node=msgspec.structs.replace(node, spawn=False))


def _log(child: LogProcess) -> Registry:
    """The log process's gauges, which the workers' own (following) logs do not know; the
    worker that serves a scrape combines them with its own as its gauges say."""
    registry = Registry()
    for name, read in (
        ("gateway_log_sequencer", lambda: float(child.sequencer)),
        ("gateway_log_size", lambda: float(child.size)),
        ("gateway_log_read_back", lambda: float(child.read_back)),
    ):
        registry.register(Gauge.single(name, "", read))
    return registry


def serve_workers(config: Config, host: str, port: int, count: int) -> int:
    """Run the parent until it is stopped; its exit code."""
    prepare_to_serve(config)
    listener = listen(host, port)
    try:
        return asyncio.run(Parent(config, listener, count).run())
    finally:
        listener.close()
