"""The transparency log in a process of its own (`[proofs] log_process`, `gateway serve`).

Integrating receipts is Python work on the event loop (public receipts, hashes, tiles:
about 50 µs a receipt on the 2-core VM in its slow phase) that no request waits for. In a
child process it runs on another core. The child holds about 35 MiB of its own: off by
default (docs/speed.md and bench/HISTORY.md have the measurements).

The child is a second handle on the same storage. It takes the log's sequencer lock
(SQLite: a flock beside the database; PostgreSQL: the advisory lock) before `gateway
serve` starts its own log, which then follows: it serves proofs, checkpoints and tiles
from the stored log. If the child dies, the kernel frees its lock and the gateway's own
log takes over within `FOLLOW_S` (it keeps trying), so a receipt is never left unlogged
for long; the child is not restarted.

The child reads its stdin: first its settings (the storage URL may hold a password: never
in its command line), then the receipts the gateway settles, as JSON lines sent as they
are stored, a write every `FEED_EVERY_S`. The log takes them from memory as the gateway's
own log does (only their ids and order come from storage); a receipt that is not fed
(the pipe full, a line it cannot read) is read back from storage, as one settled by
another instance is. It says on stdout whether it holds the sequencer lock, the size of
its tree and how many receipts it read back, once its log has started and whenever they
change (the gateway reports them as its own: /healthz and the `gateway_log_*` gauges; its
own log, following, learns the size only every second). At a stop the gateway sends what
it has not fed yet and closes the pipe, then sends SIGTERM (which the child also gets from
the kernel if the gateway dies: PR_SET_PDEATHSIG); the child reads the pipe to its end,
integrates once more and reports once more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import orjson

from model_gateway.gateway.cluster.background import stop_child, stop_tasks
from model_gateway.gateway.ops.children import LOG_PROCESS_ARG, child_command, die_with_parent
from model_gateway.storage import ReceiptRecord

if TYPE_CHECKING:
    from model_gateway.gateway.proofs.log import TransparencyLog

log = logging.getLogger("gateway.proofs")

READY_WAIT_S = 15.0
STOP_GRACE_S = 10.0
REPORT_EVERY_S = 0.25
# Settled receipts go to the child in one write this often. Every 10 ms measured 0.85-0.94x
# the req/s of the child reading them back (each write wakes it, on a core the load shares);
# every 100 ms, within the noise of it, with about half the child's CPU.
FEED_EVERY_S = 0.1
# Bytes the pipe's transport may hold for a slow child; beyond that, receipts are not fed
# (the child reads them back from storage) rather than held in memory here.
FEED_BUFFER_LIMIT = 4 * 1024 * 1024
LINE_LIMIT = 1024 * 1024  # a receipt line is about 1 KB
FEED_DRAIN_S = 2.0  # at its stop, how long the child reads what is left in the pipe
REPORTS_DRAIN_S = 1.0  # once the child has exited, how long its last reports may take
# A receipt the child was not fed within this long of finding it first in line is read back.
FED_WITHIN_S = 10 * FEED_EVERY_S


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
        self.read_back = 0
        self._reports: asyncio.Task[None] | None = None
        self._fed: list[bytes] = []  # encoded receipts waiting for the next write
        self._feed_due: asyncio.TimerHandle | None = None
        self._encode = msgspec.json.Encoder().encode

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
        self.process.stdin.write(orjson.dumps(self._settings) + b"\n")
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
            sequencer, size, read_back = report["sequencer"], report["size"], report["read_back"]
            self.sequencer, self.size, self.read_back = bool(sequencer), int(size), int(read_back)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("the log process printed something other than a report; ignored")

    def offer(self, record: ReceiptRecord) -> None:
        """A receipt this process is settling (see `TransparencyLog.offer`): fed to the
        child while it integrates, so that it need not read the receipt back."""
        if self.sequencer:
            self._fed.append(self._encode(record))
            if self._feed_due is None:
                loop = asyncio.get_running_loop()
                self._feed_due = loop.call_later(FEED_EVERY_S, self._feed)

    def _feed(self) -> None:
        self._feed_due = None
        lines, self._fed = self._fed, []
        pipe = None if self.process is None else self.process.stdin
        if not lines or pipe is None or pipe.is_closing():
            return
        if pipe.transport.get_write_buffer_size() > FEED_BUFFER_LIMIT:
            return  # a child that cannot keep up reads these back
        pipe.write(b"\n".join(lines) + b"\n")

    async def stop(self) -> None:
        # The last receipts go, then the pipe closes: the child reads them to its end.
        self.sequencer = False  # no more offers
        if self._feed_due is not None:
            self._feed_due.cancel()
        self._feed()
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()
        # The child next: a cancel of this caller, raised once the reader has ended, must
        # not leave the child running. Its exit ends the reader, after its last report.
        await stop_child(self.process, STOP_GRACE_S)
        if self._reports is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reports), REPORTS_DRAIN_S)
        await stop_tasks(self._reports)
        self.sequencer = False  # whatever its last report said: it is gone


async def _run(settings: dict[str, str], stdin: asyncio.StreamReader) -> None:
    from model_gateway.gateway.proofs.log import TransparencyLog
    from model_gateway.gateway.proofs.log_key import load_or_create_signing_key
    from model_gateway.storage import open_storage

    storage = await open_storage(settings["storage_url"])
    try:
        key = load_or_create_signing_key(Path(settings["signing_key_file"]))
        transparency_log = TransparencyLog(
            storage, key, origin=settings["origin"], offer_wait_s=FED_WITHIN_S
        )
        stopping = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stopping.set)
        await transparency_log.start()
        feed = asyncio.create_task(_take_fed(stdin, transparency_log))
        said = None
        while not stopping.is_set():
            said = _report(transparency_log, said)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), REPORT_EVERY_S)
        # What the gateway fed last is in the pipe, closed before SIGTERM: read it to its end.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(feed), FEED_DRAIN_S)
        await stop_tasks(feed)
        await transparency_log.stop()
        _report(transparency_log, said)  # after the last integration
    finally:
        await storage.close()


def _report(
    transparency_log: TransparencyLog, said: dict[str, bool | int] | None
) -> dict[str, bool | int]:
    """Tell the gateway the log's state on stdout, when it changed since `said`."""
    state = {
        "sequencer": transparency_log.sequencer,
        "size": transparency_log.size,
        "read_back": transparency_log.read_back,
    }
    if state != said:
        sys.stdout.buffer.write(orjson.dumps(state) + b"\n")
        sys.stdout.flush()
    return state


async def _take_fed(stdin: asyncio.StreamReader, transparency_log: TransparencyLog) -> None:
    """The receipts the gateway feeds, offered to the log until the gateway closes the pipe.
    A line that is not a receipt is skipped: that receipt is read back from storage."""
    decode = msgspec.json.Decoder(ReceiptRecord).decode
    while True:
        try:
            line = await stdin.readline()
            if not line:
                return
            transparency_log.offer(decode(line))
        except (msgspec.DecodeError, ValueError):  # ValueError: a line over LINE_LIMIT
            log.warning("the log process got a line that is not a receipt; ignored")


async def _main() -> None:
    from model_gateway.gateway.ops.logs import configure_logging

    stdin = asyncio.StreamReader(limit=LINE_LIMIT)
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    settings = orjson.loads(await stdin.readline())
    configure_logging("json" if settings["log_format"] == "json" else "text")
    await _run(settings, stdin)


def run_child() -> None:
    """The child: `python -m model_gateway.gateway.proofs.log_process`, settings on stdin."""
    import uvloop

    uvloop.run(_main())


if __name__ == "__main__":
    run_child()
