"""The events of a run, for the console's SSE endpoint and the run page.

Storage is the one source: a subscriber reads the run's persisted steps and yields each
once its record is closed (so a late subscriber sees everything, in order), then waits
for the next change. A step in flight is announced once (`step.started`), so a page
can show what is running. This process's engine wakes subscribers at once (`notify`);
a run owned by another instance is noticed by polling. The last event is `end`, with
the whole run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from model_gateway.gateway.agents.agent_views import run_view, step_view
from model_gateway.storage import Storage
from model_gateway.storage.base import StepRecord

POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class RunEvent:
    event: str  # step.started (a step in flight) | step (a step closed) | end
    data: dict[str, Any]
    id: int | None = None  # the step's position, for SSE's last-event-id

    def sse(self) -> bytes:
        """One Server-Sent Events message."""
        head = f"event: {self.event}\n" + ("" if self.id is None else f"id: {self.id}\n")
        return head.encode() + b"data: " + orjson.dumps(self.data) + b"\n\n"


class RunFeed:
    def __init__(self, storage: Storage, *, poll_s: float = POLL_S) -> None:
        self.storage = storage
        self.poll_s = poll_s
        self._waiters: dict[str, set[asyncio.Event]] = {}

    def notify(self, run_id: str) -> None:
        for changed in self._waiters.get(run_id, ()):
            changed.set()

    async def events(self, run_id: str, after: int = 0) -> AsyncIterator[RunEvent]:
        """Step events from step `after` on, then `end`; nothing for an unknown run."""
        sent = announced = after
        while True:
            changed = asyncio.Event()
            # Registered before reading: a change after the read still wakes this loop.
            self._waiters.setdefault(run_id, set()).add(changed)
            try:
                run = await self.storage.get_run(run_id)
                if run is None:
                    return
                steps = await self.storage.run_steps(run_id)
                while sent < len(steps) and steps[sent].closed_at is not None:
                    yield RunEvent("step", step_view(steps[sent]), id=sent)
                    sent += 1
                if sent < len(steps) and announced < sent + 1:  # one in flight: say so once
                    announced = sent + 1
                    yield RunEvent("step.started", _started(steps[sent]))
                if run.status != "running":  # read before its steps: they are all closed
                    yield RunEvent("end", run_view(run, steps))
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), self.poll_s)
            finally:
                waiters = self._waiters.get(run_id, set())
                waiters.discard(changed)
                if not waiters:
                    self._waiters.pop(run_id, None)


def _started(step: StepRecord) -> dict[str, str]:
    return {"kind": step.kind, "model" if step.kind == "model" else "runtime": step.subject}
