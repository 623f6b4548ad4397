"""Per-execution control groups, made under the node's own cgroup.

cgroup v1 controllers (memory, pids, cpu) set the limits; a v2 group, which needs
no controller, gives `cgroup.kill`, the one way to kill every descendant at once,
even those that left the process group. Whatever is missing is reported, and the
run loop falls back to rlimits and process-group kill.
"""

import contextlib
import errno
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

BASE_NAME = "gateway-sandbox"
# Files that must exist in a fresh child group for a controller to be usable.
REQUIRED = {
    "memory": "memory.limit_in_bytes",
    "pids": "pids.max",
    "cpu": "cpu.cfs_quota_us",
    "kill": "cgroup.kill",
}
CPU_PERIOD_US = 100_000  # the kernel's default cfs period


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    pids_max: int
    cpus: float


class Cgroup:
    """The groups of one execution; `procs_files` are what its first process joins."""

    def __init__(self, dirs: dict[str, str]) -> None:
        self._dirs = dirs
        self.procs_files = [os.path.join(d, "cgroup.procs") for d in dirs.values()]

    def kill(self) -> None:
        if "kill" in self._dirs:
            with contextlib.suppress(FileNotFoundError):  # already removed
                _write(self._dirs["kill"], "cgroup.kill", "1")
        # Without cgroup.kill, kill what the groups list: callers retry until empty.
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def oom_killed(self) -> bool:
        if "memory" not in self._dirs:
            return False
        with open(os.path.join(self._dirs["memory"], "memory.oom_control")) as f:
            counters = dict(line.split() for line in f)
        return int(counters.get("oom_kill", "0")) > 0

    def remove(self) -> None:
        """Kills what is left and removes the groups."""
        for path in self._dirs.values():
            for _ in range(200):  # dying tasks keep a group busy for a few milliseconds
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise
                    self.kill()
                    time.sleep(0.005)
            else:
                logger.warning("cgroup %s still busy after kill; left in place", path)

    def _pids(self) -> list[int]:
        pids: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(FileNotFoundError), open(procs) as f:
                pids.update(int(line) for line in f if line.strip())
        return sorted(pids)


class CgroupHost:
    """Where this node may create groups: controller name -> base directory."""

    def __init__(self, bases: dict[str, str]) -> None:
        self.bases = bases

    @classmethod
    def discover(cls) -> "CgroupHost":
        own = _own_groups()
        bases = {}
        for name, required in REQUIRED.items():
            hierarchy = "" if name == "kill" else name  # "" is the v2 hierarchy
            if hierarchy not in own:
                continue
            base = os.path.join(own[hierarchy], BASE_NAME)
            if _usable(base, required):
                bases[name] = base
        return cls(bases)

    def names(self) -> set[str]:
        """The groups that exist under any base, this node's and others'."""
        found: set[str] = set()
        for base in self.bases.values():
            found.update(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
        return found

    def open(self, name: str) -> Cgroup:
        return Cgroup({c: os.path.join(base, name) for c, base in self.bases.items()})

    def create(self, name: str, limits: Limits) -> Cgroup:
        dirs = {}
        try:
            for controller, base in self.bases.items():
                dirs[controller] = path = os.path.join(base, name)
                os.mkdir(path, 0o700)
            if "memory" in dirs:
                _write(dirs["memory"], "memory.limit_in_bytes", str(limits.memory_bytes))
                # Same cap for memory+swap, or the limit is escaped by swapping.
                if os.path.exists(os.path.join(dirs["memory"], "memory.memsw.limit_in_bytes")):
                    _write(dirs["memory"], "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            if "pids" in dirs:
                _write(dirs["pids"], "pids.max", str(limits.pids_max))
            if "cpu" in dirs:
                _write(dirs["cpu"], "cpu.cfs_quota_us", str(int(limits.cpus * CPU_PERIOD_US)))
        except BaseException:
            Cgroup(dirs).remove()
            raise
        return Cgroup(dirs)


def _own_groups() -> dict[str, str]:
    """Hierarchy ("memory", ..., "" for v2) -> directory of this process's own group."""
    mounts: dict[str, tuple[str, str]] = {}  # hierarchy -> (root inside it, mount point)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, (fstype, _source, options) = left.split(), right.split()[:3]
            if fstype == "cgroup2":
                mounts.setdefault("", (fields[3], fields[4]))
            elif fstype == "cgroup":
                for option in options.split(","):
                    mounts.setdefault(option, (fields[3], fields[4]))
    groups = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for hierarchy in controllers.split(",") if controllers else [""]:
                if hierarchy in mounts:
                    root, mount_point = mounts[hierarchy]
                    relative = os.path.relpath(path, root)
                    if not relative.startswith(".."):
                        groups[hierarchy] = os.path.normpath(os.path.join(mount_point, relative))
    return groups


def _usable(base: str, required: str) -> bool:
    try:
        os.makedirs(base, 0o700, exist_ok=True)
        probe = os.path.join(base, f"probe-{secrets.token_hex(4)}")
        os.mkdir(probe)
    except OSError:
        return False
    try:
        return os.path.exists(os.path.join(probe, required))
    finally:
        os.rmdir(probe)


def _write(directory: str, name: str, value: str) -> None:
    with open(os.path.join(directory, name), "w") as f:
        f.write(value)
