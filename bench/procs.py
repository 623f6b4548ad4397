"""Server processes for the bench: start, health check, stop, and /proc readings."""

from __future__ import annotations

import contextlib
import http.client
import os
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class StartError(Exception):
    """A server did not come up; the message says why, with the end of any log."""


def http_request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, bytes]:
    """One request to 127.0.0.1:port; (status, body). OSError if it cannot be made."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body, headers or {})
        answer = connection.getresponse()
        return answer.status, answer.read()
    except http.client.HTTPException as error:
        raise OSError(f"bad HTTP answer: {error!r}") from error
    finally:
        connection.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One process started by the bench, in its own process group, logging to a file."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.port = port
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout_s: float = 30.0, path: str = "/healthz") -> None:
        """Poll GET `path` until it answers 200; StartError if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StartError(f"exited with {self.proc.returncode}{self.log_tail()}")
            try:
                if http_request(self.port, "GET", path, timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise StartError(f"GET {path} not 200 within {timeout_s:.0f} s{self.log_tail()}")

    def log_tail(self, lines: int = 8) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines()[-lines:]
        return "".join("\n    " + line for line in text)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after 5 s."""
        if self.proc.poll() is None:
            os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait()


def process_tree(pid: int) -> list[int]:
    """pid and all its live descendants."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            todo += [int(child) for child in read_proc(task).split()]
    return pids


def read_proc(path: Path) -> str:
    """A /proc file's text, or "" if its process has gone meanwhile."""
    try:
        return path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of pid and its live descendants."""
    total = 0
    for each in process_tree(pid):
        stat = read_proc(Path(f"/proc/{each}/stat"))
        if stat:
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / CLOCK_TICKS


def memory_kib(pid: int, field: str = "VmRSS") -> int:
    """A /proc/<pid>/status memory field (VmRSS, VmHWM) of pid and its descendants."""
    total = 0
    for each in process_tree(pid):
        for line in read_proc(Path(f"/proc/{each}/status")).splitlines():
            if line.startswith(field + ":"):
                total += int(line.split()[1])
    return total


def machine_busy_seconds() -> float:
    """CPU time every process on the machine has used since boot (all cores)."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(ticks) for ticks in read_proc(Path("/proc/stat")).split()[1:8]
    )
    return (user + nice + system + irq + softirq) / CLOCK_TICKS


def own_seconds() -> float:
    """CPU time of this process and of its children that have exited (such as wrk)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )


def pin(pid: int, cpus: set[int]) -> None:
    """Run pid, its descendants and all their threads on `cpus` only (threads they start
    later inherit it from the thread that starts them)."""
    for each in process_tree(pid):
        for task in Path(f"/proc/{each}/task").glob("*"):
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.sched_setaffinity(int(task.name), cpus)
