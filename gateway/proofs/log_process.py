"""The transparency log in a process of its own (`[proofs] log_process`, `gateway serve`).

Integrating receipts is Python work on the event loop (public receipts, hashes, tiles:
about 50 µs a receipt on the 2-core VM in its slow phase) that no request waits for. In a
child process it runs on another core. Paired against `log_process = false`
(bench/paired.py, chat, both orders): 1.07x and 1.14x req/s at 32 connections; at one
connection 0.95x and 0.86x, the child's own reads of the receipts (it cannot take them
from memory) competing for the 2 cores with the load generator and the mock. The child
holds about 35 MiB of its own: off by default.

The child is a second handle on the same storage. It takes the log's sequencer lock
(SQLite: a flock beside the database; PostgreSQL: the advisory lock) before `gateway
serve` starts its own log, which then follows: it serves proofs, checkpoints and tiles
from the stored log. If the child dies, the kernel frees its lock and the gateway's own
log takes over within `FOLLOW_S` (it keeps trying), so a receipt is never left unlogged
for long; the child is not restarted.

The child gets its settings on stdin (the storage URL may hold a password: never in its
command line), says on stdout whether it holds the sequencer lock and the size of its
tree once its log has started and whenever they change (the gateway reports them as its
own: /healthz, the `gateway_log_sequencer` and `gateway_log_size` gauges; its own log,
following, learns the size only every second), and stops on SIGTERM, which it also gets
from the kernel if the gateway dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

import orjson

from model_gateway.gateway.background import stop_child, stop_tasks
from model_gateway.gateway.children import LOG_PROCESS_ARG, child_command, die_with_parent

log = logging.getLogger("gateway.proofs")

READY_WAIT_S = 15.0
STOP_GRACE_S = 10.0
REPORT_EVERY_S = 0.25


class LogProcess:
    """`gateway serve`'s side: start the child, stop it."""

    def __init__(self, storage_url: str, signing_key_file: Path, origin: str, log_format: str):
        self._settings = {
            "storage_url": storage_url,
            "signing_key_file": str(signing_key_file),
            "origin": origin,
            "log_format": log_format,
        }
        self.process: asyncio.subprocess.Process | None = None
        # As the child last said (its first line: it started); sequencer False once it is gone.
        self.sequencer = False
        self.size = 0
        self._reports: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the child and wait until its log runs; a child that does not answer in
        time is stopped, and the gateway's own log integrates."""
        self.process = await asyncio.create_subprocess_exec(
            *child_command(LOG_PROCESS_ARG),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=die_with_parent,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(orjson.dumps(self._settings))
        self.process.stdin.close()
        try:
            answer = await asyncio.wait_for(self.process.stdout.readline(), READY_WAIT_S)
        except TimeoutError:
            answer = b""
        if not answer:
            log.warning("the log process did not start; this process integrates the log")
            await self.stop()
            return
        self._read(answer)
        self._reports = asyncio.create_task(self._read_reports(self.process.stdout))
        log.info("log process started: pid %d runs the transparency log", self.process.pid)

    async def _read_reports(self, lines: asyncio.StreamReader) -> None:
        while answer := await lines.readline():
            self._read(answer)
        self.sequencer = False  # the child is gone: its lock with it

    def _read(self, line: bytes) -> None:
        try:
            report = orjson.loads(line)
            self.sequencer, self.size = bool(report["sequencer"]), int(report["size"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("the log process printed something other than a report; ignored")

    async def stop(self) -> None:
        # The child first: a cancel of this caller, raised once the reader has ended, must
        # not leave the child running. Its exit ends the reader too.
        await stop_child(self.process, STOP_GRACE_S)
        await stop_tasks(self._reports)
        self.sequencer = False


async def _run(settings: dict[str, str]) -> None:
    from model_gateway.gateway.proofs.log import TransparencyLog
    from model_gateway.gateway.proofs.log_key import load_or_create_signing_key
    from model_gateway.storage import open_storage

    storage = await open_storage(settings["storage_url"])
    try:
        key = load_or_create_signing_key(Path(settings["signing_key_file"]))
        transparency_log = TransparencyLog(storage, key, origin=settings["origin"])
        stopping = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stopping.set)
        await transparency_log.start()
        said = None
        while not stopping.is_set():
            state = {"sequencer": transparency_log.sequencer, "size": transparency_log.size}
            if state != said:
                said = state
                sys.stdout.buffer.write(orjson.dumps(state) + b"\n")
                sys.stdout.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), REPORT_EVERY_S)
        await transparency_log.stop()
    finally:
        await storage.close()


def run_child() -> None:
    """The child: `python -m model_gateway.gateway.proofs.log_process`, settings on stdin."""
    import uvloop

    from model_gateway.gateway.logs import configure_logging

    settings = orjson.loads(sys.stdin.buffer.read())
    configure_logging("json" if settings["log_format"] == "json" else "text")
    uvloop.run(_run(settings))


if __name__ == "__main__":
    run_child()
