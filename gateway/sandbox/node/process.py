"""Runs one prepared command as a confined child: the process half of the run loop.

The child joins its cgroups, starts a session, sets rlimits and drops to its uid
before exec (in that order: joining a root-owned cgroup needs root). The parent
keeps at most OUTPUT_CAP bytes of each output, kills on overflow, deadline or
main-process exit, and reaps with wait4. As child subreaper it also reaps what
bwrap leaves behind.
"""

import contextlib
import ctypes
import os
import resource
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

OUTPUT_CAP = 64 * 1024  # bytes kept of each of stdout and stderr
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Command:
    argv: list[str]
    cwd: str
    env: dict[str, str]
    stdin_fd: int
    pass_fds: tuple[int, ...]
    timeout_s: float
    procs_files: list[str]  # cgroup.procs files to join
    rlimits: list[tuple[int, int]]
    uid: int | None  # None: keep the node's own uid (degraded mode only)


@dataclass
class Output:
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, chunk: bytes) -> bool:
        """Keeps what fits under the cap; False once something had to be dropped."""
        room = OUTPUT_CAP - len(self.data)
        self.data += chunk[:room]
        self.truncated = self.truncated or len(chunk) > room
        return not self.truncated

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


# How a run ended: its main process exited (or an output overflowed), its deadline
# passed, or someone asked it to stop (the gateway's client left).
Ending = Literal["exited", "timed_out", "stopped"]


@dataclass(frozen=True)
class Finished:
    exit_code: int  # a signal n is reported as 128 + n, as shells do
    signal: int | None
    stdout: Output
    stderr: Output
    ending: Ending
    duration_ms: int


class StopSignal:
    """Asks one run to stop, from any thread, before or while it runs.

    An eventfd, because the run's thread sleeps in a selector: the fd wakes it at once,
    and a stop requested before the process even started is seen at its first select.
    Only the event loop's thread calls `request` and `close`, so the fd cannot be
    closed (and its number reused) between the check and the write.
    """

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.requested = False

    def request(self) -> None:
        if self.fd >= 0 and not self.requested:
            self.requested = True
            os.eventfd_write(self.fd, 1)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def become_subreaper() -> bool:
    result: int = _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    return result == 0


class Processes:
    """Starts commands and reaps orphans without stealing a running command's status."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owned: set[int] = set()

    def run(
        self, command: Command, kill_group: Callable[[], None], stop_fd: int | None = None
    ) -> Finished:
        """Blocking. `kill_group` kills the command's cgroup, whatever left the session;
        `stop_fd` (a StopSignal's) becoming readable kills the run as its deadline would."""
        started = time.monotonic()
        # Held while forking, so that reap_orphans cannot take the child before it is owned.
        with self._lock:
            proc = subprocess.Popen(  # noqa: S603 - argv is built by the node, never from input
                command.argv,
                stdin=command.stdin_fd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=command.pass_fds,
                cwd=command.cwd,
                env=command.env,
                preexec_fn=_ChildSetup(command.procs_files, command.rlimits, command.uid),
            )
            self._owned.add(proc.pid)

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            kill_group()

        try:
            stdout, stderr, ending = _collect(proc, started + command.timeout_s, kill, stop_fd)
            _, status, _ = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            kill()  # nothing of the execution outlives it
            with self._lock:
                self._owned.discard(proc.pid)
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return Finished(
            exit_code=code,
            signal=code - 128 if 128 < code <= 128 + 64 else None,
            stdout=stdout,
            stderr=stderr,
            ending=ending,
            duration_ms=int((time.monotonic() - started) * 1000),
        )

    def reap_orphans(self, uids: range) -> None:
        """Reaps exited processes of `uids` reparented to us: unreaped, they count against
        their uid's RLIMIT_NPROC."""
        with self._lock:
            while True:
                try:
                    info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                except ChildProcessError:
                    return
                # Stop at anything that is not an orphan of ours: its owner reaps it.
                if info is None or info.si_pid in self._owned or info.si_uid not in uids:
                    return
                os.waitpid(info.si_pid, os.WNOHANG)


@dataclass(frozen=True)
class _ChildSetup:
    """Runs in the forked child, before exec.

    Only system calls on values computed beforehand: the parent has other threads,
    and a forked child must not need a lock one of them may hold.
    """

    procs_files: list[str]
    rlimits: list[tuple[int, int]]
    uid: int | None

    def __call__(self) -> None:
        for path in self.procs_files:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, b"0")  # "0" moves the writing process
            os.close(fd)
        os.setsid()
        for which, value in self.rlimits:
            resource.setrlimit(which, (value, value))
        if self.uid is not None:
            os.setgroups([])
            os.setgid(self.uid)
            os.setuid(self.uid)
        # After setuid, which clears it: die with the thread that started us.
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_EXITED, _STOP = "exited", "stop"  # selector keys that are not outputs


def _collect(
    proc: subprocess.Popen[bytes],
    deadline: float,
    kill: Callable[[], None],
    stop_fd: int | None = None,
) -> tuple[Output, Output, Ending]:
    """Reads both outputs until they close and the process has exited, or the deadline.

    Overflowing a cap, reaching the deadline or a stop request kills the whole execution;
    so does the main process exiting, so that background processes never outlive it.
    """
    stdout, stderr = Output(), Output()
    pidfd = os.pidfd_open(proc.pid)
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as sel, proc.stdout, proc.stderr:
        sel.register(proc.stdout, selectors.EVENT_READ, stdout)
        sel.register(proc.stderr, selectors.EVENT_READ, stderr)
        sel.register(pidfd, selectors.EVENT_READ, _EXITED)
        if stop_fd is not None:
            sel.register(stop_fd, selectors.EVENT_READ, _STOP)
        try:
            while len(sel.get_map()) > (stop_fd is not None):  # outputs or pidfd still open
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    kill()
                    return stdout, stderr, "timed_out"
                for key, _ in sel.select(remaining):
                    if key.data is _STOP:
                        kill()
                        return stdout, stderr, "stopped"
                    if key.data is _EXITED:
                        sel.unregister(pidfd)
                        kill()
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif not key.data.add(chunk):
                        kill()
                        return stdout, stderr, "exited"
        finally:
            os.close(pidfd)
    return stdout, stderr, "exited"
