"""Stopping the gateway's background loops (the log, the sweepers, the housekeeping), and
its child processes.

One `task.cancel()` is not always enough on Python 3.11: `asyncio.wait_for` returns its
inner result, dropping the cancel, when the two arrive together (fixed in 3.12), and the
log's sequencer claim and the PostgreSQL storage call it on every turn. A loop that lost
its cancel goes on, and a shutdown that waits for it waits forever (seen in a test run:
the log's `stop` never returned). So the cancel is repeated until the task has ended: a
loop's own cleanup that awaits must shield itself (none of the loops stopped here has one).
"""

from __future__ import annotations

import asyncio

import anyio

RECANCEL_S = 0.1  # how long a cancelled task has to end before it is cancelled again


async def stop_tasks(*tasks: asyncio.Task[object] | None) -> None:
    """Cancel the tasks (None: not started) and return once every one has ended, whatever
    they raised. A caller cancelled meanwhile still waits for them, then is cancelled (by
    the same exception: an anyio scope knows its own)."""
    running = [task for task in tasks if task is not None]
    cancelled: asyncio.CancelledError | None = None
    while pending := [task for task in running if not task.done()]:
        for task in pending:
            task.cancel()
        try:
            await asyncio.wait(pending, timeout=RECANCEL_S)
        except asyncio.CancelledError as cancel:
            cancelled = cancel
    for task in running:  # their outcomes, retrieved: nothing is reported as never seen
        if not task.cancelled():
            task.exception()
    if cancelled is not None:
        raise cancelled


async def stop_child(process: asyncio.subprocess.Process | None, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; returns once the process has exited (None,
    or already exited: nothing to do). Shielded: a cancelled caller leaves no child."""
    if process is None or process.returncode is not None:
        return
    with anyio.CancelScope(shield=True):
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            process.kill()
            await process.wait()
