"""Runs untrusted programs in isolation, following shared/design/sandbox.md.

`Sandbox` probes the host once (bwrap, uid switch, cgroups, seccomp, interpreters),
reports what it found, then runs executions: each in a scratch directory owned by
a per-slot uid, in its own cgroups, under rlimits, as that uid, inside bwrap's
namespaces with a read-only view of the runtimes' part of /usr and a seccomp filter.
It refuses to run anything when namespaces or the uid switch are missing, unless told
`allow_degraded`. A run can be stopped early (`StopSignal`): status `cancelled`.
"""

import contextlib
import glob
import math
import os
import resource
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Literal

import anyio
import anyio.to_thread

from model_gateway.gateway.sandbox.node import seccomp_filter
from model_gateway.gateway.sandbox.node.cgroups import CgroupHost, Limits
from model_gateway.gateway.sandbox.node.process import (
    Command,
    Processes,
    StopSignal,
    become_subreaper,
)

SLOT_UID_BASE = 20000  # slot n runs as uid and gid 20000 + n
PIDS_MAX = 128  # tasks, threads included: node alone starts about a dozen
CPUS = 1.0
NOFILE = 256
FSIZE = 16 * 1024 * 1024
TMP_SIZE = 32 * 1024 * 1024
AS_HEADROOM = 64 * 1024 * 1024  # RLIMIT_AS = memory limit + this, for python and bash
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
SCRATCH_PREFIX = "gateway-sandbox-"  # then the node's pid, see _remove_leftovers
# What the runtimes need of /usr: interpreters and the tools scripts call, shared
# libraries, locales and python's own library. The rest of /usr (/usr/local with its
# configuration, /usr/share, /usr/include, /usr/src, ...) is not in the sandbox's view.
USR_VIEW = (
    "/usr/bin",
    "/usr/lib64",
    "/usr/lib/locale",
    "/usr/lib/*-linux-gnu*",  # the multiarch library folder: x86_64-linux-gnu, ...
    "/usr/lib/python3*",  # the standard library and Debian's packages for that python
)

# cancelled: stopped on request (the gateway's client left), billed for the time it ran.
Status = Literal["completed", "failed", "timed_out", "cancelled"]
_STATUS_OF_ENDING: dict[str, Status] = {"timed_out": "timed_out", "stopped": "cancelled"}


@dataclass(frozen=True)
class Runtime:
    interpreter: str
    flags: tuple[str, ...]
    filename: str
    # node aborts under an RLIMIT_AS below 1 GiB: its cgroup and heap flag cap it instead.
    limit_address_space: bool = True
    heap_flag: str | None = None

    def argv(self, memory_mb: int) -> list[str]:
        flags = list(self.flags)
        if self.heap_flag:
            # The heap stops short of the cgroup limit, so it fails with its own message.
            flags.append(f"{self.heap_flag}={max(16, memory_mb * 3 // 4)}")
        return [self.interpreter, *flags, self.filename]


RUNTIMES = {
    # The Debian interpreter: others (pyenv, nvm) live under /root, invisible in the sandbox.
    "python": Runtime("/usr/bin/python3", ("-I", "-B"), "main.py"),
    "node": Runtime(
        "/usr/bin/node", (), "main.js", limit_address_space=False, heap_flag="--max-old-space-size"
    ),
    "bash": Runtime("/bin/bash", (), "main.sh"),
}


@dataclass(frozen=True)
class Job:
    runtime: str
    code: str
    stdin: str = ""
    timeout_s: float = 10.0
    memory_mb: int = 128


@dataclass(frozen=True)
class Result:
    status: Status
    exit_code: int  # a signal n is reported as 128 + n, as shells do
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    oom_killed: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class IsolationError(Exception):
    """The node could not run the program (as opposed to the program failing)."""


class SandboxUnavailable(IsolationError):
    """Isolation or the runtime is missing on this host: the node refuses to execute."""


class SandboxBusy(IsolationError):
    """Every slot is running something."""


@dataclass(frozen=True)
class _Plan:
    """One execution, whatever the runtime: the probe's self-test is one too."""

    argv: list[str]
    files: dict[str, str]
    stdin: bytes
    timeout_s: float
    memory_bytes: int
    limit_address_space: bool


class Sandbox:
    """Probes the host on creation; `execute` then runs jobs, `max_concurrent` at most at once.

    Creating one makes the process a child subreaper, to reap what bwrap leaves behind.
    """

    def __init__(
        self, *, max_concurrent: int, allow_degraded: bool = False, scratch_base: str | None = None
    ) -> None:
        self._slots = list(range(max_concurrent))
        self._uids = range(SLOT_UID_BASE, SLOT_UID_BASE + max_concurrent)
        self._threads = anyio.CapacityLimiter(max_concurrent)
        self._processes = Processes()
        self._notes: list[str] = []
        subreaper = become_subreaper()
        self._switch_uid = os.geteuid() == 0
        self._cgroups = CgroupHost.discover() if self._switch_uid else CgroupHost({})
        if "memory" not in self._cgroups.bases:
            self._notes.append("no memory cgroup: node's memory is capped only by its heap flag")
        self._seccomp = self._build_seccomp()
        self._runtimes = {n: rt for n, rt in RUNTIMES.items() if os.access(rt.interpreter, os.X_OK)}
        self._scratch_base = scratch_base or self._default_scratch_base()
        self._remove_leftovers()
        self._bwrap_base = _bwrap_base_argv()
        if not self._bwrap_base:
            self._notes.append("bwrap not found: install bubblewrap (scripts/system-deps.sh)")
        namespaces = bool(self._bwrap_base) and self._self_test()
        layers = {"namespaces": namespaces, "uid switch": self._switch_uid}
        missing = [name for name, ok in layers.items() if not ok]
        self.refusal = f"isolation unavailable: no {' or '.join(missing)}" if missing else None
        self.degraded = bool(missing) and allow_degraded
        if self.degraded:
            self._notes.append(f"DEGRADED: running without {' or '.join(missing)}")
        if not namespaces:
            self._bwrap_base = []  # degraded mode runs the interpreter directly
        self.report = {
            "will_execute": self.will_execute,
            "degraded": self.degraded,
            "refusal": None if self.will_execute else self.refusal,
            "namespaces": namespaces,
            "uid_switch": self._switch_uid,
            "seccomp": self._seccomp is not None,
            "cgroups": {c: c in self._cgroups.bases for c in ("memory", "pids", "cpu", "kill")},
            "subreaper": subreaper,
            "runtimes": sorted(self._runtimes),
            "max_concurrent": max_concurrent,
            "notes": self._notes,
        }

    @property
    def will_execute(self) -> bool:
        return self.refusal is None or self.degraded

    async def execute(self, job: Job, stop: StopSignal | None = None) -> Result:
        """Runs `job` in a worker thread; raises SandboxUnavailable or SandboxBusy.

        `stop.request()` ends the run early (status `cancelled`); the slot is free again
        when this returns, never before.
        """
        if not self.will_execute:
            raise SandboxUnavailable(self.refusal)
        if job.runtime not in self._runtimes:
            raise SandboxUnavailable(f"runtime {job.runtime!r} is not installed on this node")
        if not self._slots:
            raise SandboxBusy("all sandbox slots are busy")
        slot = self._slots.pop()  # only the event loop's thread touches the slot list
        try:
            # Never abandoned on cancellation: a slot's uid is reused only once it is idle.
            return await anyio.to_thread.run_sync(self.run, job, slot, stop, limiter=self._threads)
        finally:
            self._slots.append(slot)

    def run(self, job: Job, slot: int, stop: StopSignal | None = None) -> Result:
        """Blocking: runs `job` as slot `slot`, which the caller guarantees is idle."""
        runtime = self._runtimes[job.runtime]
        plan = _Plan(
            argv=runtime.argv(job.memory_mb),
            files={runtime.filename: job.code},
            stdin=job.stdin.encode(),
            timeout_s=job.timeout_s,
            memory_bytes=job.memory_mb * 1024 * 1024,
            limit_address_space=runtime.limit_address_space,
        )
        return self._run(plan, slot, stop)

    def _run(self, plan: _Plan, slot: int, stop: StopSignal | None = None) -> Result:
        uid = SLOT_UID_BASE + slot if self._switch_uid else None
        # Also before: orphans still exiting when the last run ended are zombies by now.
        self._processes.reap_orphans(self._uids)
        with contextlib.ExitStack() as cleanup:  # unwinds last in, first out
            cgroup = None
            if self._cgroups.bases:
                name = f"{os.getpid()}-slot{slot}-{secrets.token_hex(4)}"
                cgroup = self._cgroups.create(name, Limits(plan.memory_bytes, PIDS_MAX, CPUS))
                cleanup.callback(cgroup.remove)
            scratch = self._make_scratch(plan.files, uid)
            cleanup.callback(shutil.rmtree, scratch, ignore_errors=True)
            stdin = cleanup.enter_context(_memfd("stdin", plan.stdin))
            argv = plan.argv
            pass_fds: tuple[int, ...] = ()
            if self._bwrap_base:
                seccomp = None
                if self._seccomp:
                    seccomp = cleanup.enter_context(_memfd("seccomp", self._seccomp))
                    pass_fds = (seccomp,)
                argv = self._bwrap_argv(scratch, seccomp, plan.argv)
            command = Command(
                argv=argv,
                cwd=scratch,
                # bwrap sets the sandbox's own; its /proc/1/environ must not show the host path
                env=ENV if self._bwrap_base else {**ENV, "HOME": scratch},
                stdin_fd=stdin,
                pass_fds=pass_fds,
                timeout_s=plan.timeout_s,
                procs_files=cgroup.procs_files if cgroup else [],
                rlimits=_rlimits(plan),
                uid=uid,
            )
            kill_group = cgroup.kill if cgroup else lambda: None
            finished = self._processes.run(command, kill_group, stop.fd if stop else None)
            oom_killed = cgroup.oom_killed() if cgroup else False
        self._processes.reap_orphans(self._uids)
        status = _STATUS_OF_ENDING.get(finished.ending)
        if status is None:
            status = "completed" if finished.exit_code == 0 else "failed"
        return Result(
            status=status,
            exit_code=finished.exit_code,
            signal=finished.signal,
            stdout=finished.stdout.text(),
            stderr=finished.stderr.text(),
            stdout_truncated=finished.stdout.truncated,
            stderr_truncated=finished.stderr.truncated,
            duration_ms=finished.duration_ms,
            oom_killed=oom_killed,
        )

    def _make_scratch(self, files: dict[str, str], uid: int | None) -> str:
        scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=self._scratch_base)
        for name, text in files.items():
            path = os.path.join(scratch, name)
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(text)
            if uid is not None:
                os.chown(path, uid, uid)
        if uid is not None:
            os.chown(scratch, uid, uid)
        return scratch

    def _remove_leftovers(self) -> None:
        """Removes the cgroups and scratch of nodes killed before they could clean up.

        Both are named after their node's pid: others' may belong to a running node.
        """
        for name in self._cgroups.names():
            if _owner_is_dead(name):
                self._cgroups.open(name).remove()
        for entry in os.scandir(self._scratch_base):
            if entry.name.startswith(SCRATCH_PREFIX) and _owner_is_dead(
                entry.name.removeprefix(SCRATCH_PREFIX)
            ):
                shutil.rmtree(entry.path, ignore_errors=True)

    def _default_scratch_base(self) -> str:
        # On tmpfs, what a program writes is charged to its memory cgroup instead of
        # filling the host's disk; without that cgroup, tmpfs would eat host memory.
        shm = "/dev/shm"  # noqa: S108 - a private mkdtemp directory is made inside
        if "memory" in self._cgroups.bases and os.path.isdir(shm):
            return shm
        return tempfile.gettempdir()

    def _bwrap_argv(self, scratch: str, seccomp: int | None, inner: list[str]) -> list[str]:
        argv = [*self._bwrap_base, "--bind", scratch, "/work", "--chdir", "/work"]
        argv += ["--remount-ro", "/", "--clearenv", "--setenv", "HOME", "/work"]
        for name, value in ENV.items():
            argv += ["--setenv", name, value]
        if seccomp is not None:
            argv += ["--seccomp", str(seccomp)]
        return [*argv, "--", *inner]

    def _build_seccomp(self) -> bytes | None:
        try:
            return seccomp_filter.build_bpf()
        except (ImportError, OSError, RuntimeError) as exc:
            self._notes.append(f"seccomp unavailable: {exc}")
            return None

    def _self_test(self) -> bool:
        plan = _Plan(["/usr/bin/true"], {}, b"", 10.0, 64 * 1024 * 1024, True)
        try:
            result = self._run(plan, slot=0)
        except (OSError, subprocess.SubprocessError) as exc:
            self._notes.append(f"sandbox self-test could not start: {exc}")
            return False
        if result.status != "completed":
            self._notes.append(f"sandbox self-test failed: {result.stderr.strip()[:300]}")
        return result.status == "completed"


def _bwrap_base_argv() -> list[str]:
    """bwrap and the options shared by every execution; [] without bwrap."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return []
    argv = [
        bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
        "--hostname", "sandbox", *_usr_view(),
    ]  # fmt: skip
    usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, check=False)  # noqa: S603
    if "--disable-userns" in usage.stdout:  # bwrap >= 0.8; seccomp also denies CLONE_NEWUSER
        argv.append("--disable-userns")
    for top in ("/bin", "/sbin", "/lib", "/lib64"):  # merged /usr: links; else read-only binds
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    return [*argv, "--size", str(TMP_SIZE), "--tmpfs", "/tmp"]  # noqa: S108 - the sandbox's own


def _usr_view() -> list[str]:
    """bwrap arguments that show the parts of /usr in USR_VIEW, read-only."""
    argv = []
    for pattern in USR_VIEW:
        for path in sorted(glob.glob(pattern)):
            if os.path.islink(path):  # e.g. /usr/lib64 -> lib on some distributions
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
    return argv


def _owner_is_dead(name: str) -> bool:
    """For names that start with "<pid>-": is that process gone?"""
    pid = name.split("-", 1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def _rlimits(plan: _Plan) -> list[tuple[int, int]]:
    limits = [
        (resource.RLIMIT_CPU, math.ceil(plan.timeout_s) + 1),
        (resource.RLIMIT_FSIZE, FSIZE),
        (resource.RLIMIT_NOFILE, NOFILE),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, PIDS_MAX),  # enforced for non-root uids only
    ]
    if plan.limit_address_space:
        limits.append((resource.RLIMIT_AS, plan.memory_bytes + AS_HEADROOM))
    return limits


@contextlib.contextmanager
def _memfd(name: str, data: bytes) -> Iterator[int]:
    """An anonymous file holding `data`, read from the start by the child."""
    fd = os.memfd_create(name)
    try:
        with open(fd, "wb", closefd=False) as f:  # buffered: writes all of it
            f.write(data)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)
