"""Takes one part out of a gateway, to measure what that part costs: Python imports this
module at start-up when bench/ablate.py puts this folder on PYTHONPATH, and it applies
the ablation named by GATEWAY_ABLATION. A measuring tool only: an ablated gateway does
not keep the books (see each ablation).
"""

from __future__ import annotations

import os


def no_settle_sql() -> None:
    """A settlement writes nothing: no receipt, no charge, nothing offered to the log (so
    the log has nothing to do). A direct hold is then never freed: the bench's project
    holds enough for that."""
    from model_gateway.gateway.metering import StorageMeter

    async def charge_nothing(self: StorageMeter, receipt: object) -> bool:
        return True

    StorageMeter._charge = charge_nothing


def no_log() -> None:
    """The transparency log never starts and is offered nothing: receipts stay unlogged."""
    from model_gateway.gateway.proofs.log import TransparencyLog

    async def nothing(self: TransparencyLog) -> None:
        return None

    TransparencyLog.start = nothing
    TransparencyLog.stop = nothing
    TransparencyLog.offer = lambda self, record: None


def inline_write() -> None:
    """A write that finds no batch running or waiting runs at once in its caller's task: no
    batch task, no turn of the loop to gather others. Group commit ends under load (a batch
    runs synchronously, so every write finds none running): measure it one request at a
    time."""
    from model_gateway.storage.batching import Batcher

    queued = Batcher.submit

    async def submit(self: Batcher, item: object) -> object:
        if self._flusher is None and not self._pending:
            (outcome,) = await self._run([item])
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        return await queued(self, item)

    Batcher.submit = submit


ABLATIONS = {"no-settle-sql": no_settle_sql, "no-log": no_log, "inline-write": inline_write}

if (_name := os.environ.get("GATEWAY_ABLATION")) is not None:
    ABLATIONS[_name]()
