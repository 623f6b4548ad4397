"""This process as one worker of `gateway serve --workers N` (gateway/ops/workers.py): what
it shares with the other workers through the run folder the parent made for them.

- `ratelimit.buckets`: the rate limits' buckets, in memory every worker maps
  (gateway/ratelimit/shared_gcra.py), when no other store shares them (SQLite, no Redis).
- `<name>.metrics.sock`: each worker's metric samples, and the parent's (its log process'
  gauges), as JSON, to whoever connects. The worker that serves a scrape of `/metrics`
  asks every other socket and adds their samples to its own (metrics_text.Registry): the
  answer counts the whole server whichever worker gives it, and exactly: each worker
  reads its own live counters at that moment. A worker that does not answer within
  `ASK_TIMEOUT_S` (dead, restarting) is left out of that scrape: its counts are gone with
  it, so the server's totals step down as a restarted Prometheus target's would.

Kept free of heavy imports: the single-process server imports it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from model_gateway.gateway.ops.metrics import Metrics
    from model_gateway.gateway.ops.metrics_text import PeerSamples, Registry

log = logging.getLogger("gateway")

METRICS_SUFFIX = ".metrics.sock"
LIMITER_FILE = "ratelimit.buckets"
ASK_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class WorkerSeat:
    run_folder: Path
    index: int

    @property
    def limiter_file(self) -> Path:
        return self.run_folder / LIMITER_FILE

    async def share_metrics(self, metrics: Metrics) -> Callable[[], Awaitable[None]]:
        """Serve this worker's samples to the others, and gather theirs at each scrape;
        returns what stops serving them."""
        path = self.run_folder / f"worker-{self.index}{METRICS_SUFFIX}"
        close = await serve_samples(path, metrics.registry)
        metrics.peers = lambda: gather_samples(self.run_folder, path)
        return close


async def serve_samples(path: Path, registry: Registry) -> Callable[[], Awaitable[None]]:
    """Answer every connection on the Unix socket `path` with `registry`'s samples."""

    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            writer.write(orjson.dumps(registry.samples()))
            await writer.drain()
        writer.close()

    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a worker's predecessor at this seat
    server = await asyncio.start_unix_server(answer, path)
    os.chmod(path, 0o600)  # the run folder is 0700 already

    async def close() -> None:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    return close


async def gather_samples(run_folder: Path, own: Path) -> list[PeerSamples]:
    """Every other socket's samples in the run folder (those that answer)."""
    sockets = [
        run_folder / name for name in os.listdir(run_folder) if name.endswith(METRICS_SUFFIX)
    ]
    sockets.remove(own)
    answers = await asyncio.gather(*(_ask(p) for p in sockets))
    return [answer for answer in answers if answer is not None]


async def _ask(path: Path) -> PeerSamples | None:
    try:
        async with asyncio.timeout(ASK_TIMEOUT_S):
            reader, writer = await asyncio.open_unix_connection(path)
            try:
                data = await reader.read()
            finally:
                writer.close()
        samples: PeerSamples = orjson.loads(data)
    except (OSError, TimeoutError, orjson.JSONDecodeError) as exc:
        log.debug("metrics: %s did not answer (%s)", path.name, exc)
        return None
    return samples
