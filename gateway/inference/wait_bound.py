"""A bound on each wait for an upstream: for a stream, one timer for all of its waits.

`asyncio.timeout` arms a timer on entry and cancels it on exit: about 6.5 µs a use on
uvloop, paid for every read of a stream. Here the timer is armed by the first wait and
left running: when it fires, a wait that has lasted the bound is cancelled, and otherwise
the timer is set again for the current wait's end (or left for the next wait to arm,
between waits). A stream's wait then costs a clock read (0.9 µs in all); a whole answer's
single wait, a timer of its own (3.6 µs). The outcome is asyncio.timeout's: the waiting
task is cancelled, and the cancellation becomes `TimeoutError` unless the task was also
cancelled for another reason (the client left), which then goes on as it is.
"""

from __future__ import annotations

import asyncio


class WaitBound:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[object] | None = None
        self._since: float | None = None  # the loop's time the current wait began
        self._timer: asyncio.TimerHandle | None = None
        self._when = 0.0  # the loop's time the timer is armed for
        self._expired = False
        self._cancelling = 0  # the task's cancellation requests when its wait began

    def __enter__(self) -> None:
        """Bound the wait inside the block: TimeoutError once it has lasted `timeout_s`."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task, self._cancelling = task, task.cancelling()
        self._since = now = self._loop.time()
        if self._timer is None:
            self._when = now + self.timeout_s
            self._timer = self._loop.call_at(self._when, self._check)

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._since = None
        if self._expired:  # a cancellation of ours, swallowed or not, is balanced as asyncio's
            self._expired = False
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
                raise TimeoutError

    def _check(self) -> None:
        assert self._loop is not None and self._task is not None
        self._timer = None
        if self._since is None:
            return  # between waits: the next wait arms the timer again
        due = self._since + self.timeout_s
        # The loop says `_when` has come: trusted, as asyncio.timeout trusts it. Reading the
        # clock again would spin on uvloop, whose timers round to the millisecond and fire
        # while its clock still reads a hair short of the time they were armed for.
        if due <= self._when:
            self._expired = True
            self._task.cancel()
        else:
            self._when = due
            self._timer = self._loop.call_at(due, self._check)

    def close(self) -> None:
        """No more waits: the timer goes."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
