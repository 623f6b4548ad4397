"""Hostile programs against the host's real isolation."""

import asyncio
import os
import socket
import subprocess
import textwrap
import threading
import time

import pytest

from model_gateway.gateway.sandbox.node import isolation
from model_gateway.gateway.sandbox.node.cgroups import CgroupHost
from model_gateway.gateway.sandbox.node.isolation import (
    SLOT_UID_BASE,
    Job,
    Sandbox,
    SandboxBusy,
    SandboxUnavailable,
)
from model_gateway.gateway.sandbox.node.process import OUTPUT_CAP, StopSignal


def run_python(sandbox: Sandbox, code: str, **limits) -> isolation.Result:
    return sandbox.run(Job("python", textwrap.dedent(code), **limits), slot=0)


def needs(sandbox: Sandbox, runtime: str) -> None:
    if runtime not in sandbox.report["runtimes"]:
        pytest.skip(f"{runtime} is not installed on this host")


def needs_seccomp() -> None:
    # Installed with the project; when it is, a failing seccomp layer fails these tests.
    pytest.importorskip("pyseccomp", reason="pyseccomp not installed: no seccomp layer")


@pytest.mark.parametrize(
    ("runtime", "code"),
    [
        ("python", "import sys; print(sys.stdin.read().upper())"),
        ("node", "process.stdin.on('data', d => console.log(d.toString().toUpperCase()))"),
        ("bash", "read line; echo ${line^^}"),
    ],
)
def test_program_reads_stdin_and_writes_stdout(sandbox, runtime, code):
    needs(sandbox, runtime)
    result = sandbox.run(Job(runtime, code, stdin="hello\n"), slot=0)
    assert (result.status, result.exit_code, result.stdout.strip()) == ("completed", 0, "HELLO")


def test_failure_is_reported_with_exit_code_and_stderr(sandbox):
    result = run_python(sandbox, "import sys; sys.exit('boom')")
    assert (result.status, result.exit_code, result.signal) == ("failed", 1, None)
    assert result.stderr == "boom\n"


def test_runs_as_slot_uid_without_capabilities_under_seccomp(sandbox):
    needs_seccomp()
    result = run_python(sandbox, "print(open('/proc/self/status').read())")
    status = dict(line.split(":\t", 1) for line in result.stdout.strip().splitlines())
    assert status["Uid"].split()[0] == str(SLOT_UID_BASE)
    assert status["CapEff"].strip() == "0000000000000000"
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"  # filter mode


def test_network_is_unreachable_including_host_loopback(sandbox):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        result = run_python(
            sandbox,
            f"""
            import socket
            for family, address in [(socket.AF_INET, ("127.0.0.1", {port})),
                                    (socket.AF_INET6, ("::1", {port})),
                                    (socket.AF_INET, ("1.1.1.1", 53))]:
                try:
                    socket.socket(family).connect(address)
                    print("connected", address)
                except OSError as exc:
                    print("blocked", exc.errno)
            """,
        )
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert "connected" not in result.stdout
    assert result.stdout.count("blocked") == 3


def test_host_abstract_unix_sockets_are_unreachable(sandbox):
    name = f"\0gateway-sandbox-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(name)
        listener.listen()
        result = run_python(
            sandbox,
            f"""
            import socket
            try:
                socket.socket(socket.AF_UNIX).connect({name!r})
                print("connected")
            except OSError as exc:
                print("blocked", exc.strerror)
            """,
        )
    assert result.stdout.startswith("blocked")


def test_host_files_are_invisible(sandbox, tmp_path):
    secret = tmp_path / "gateway-secret"
    secret.write_text("top secret")
    result = run_python(
        sandbox,
        f"""
        import os
        for path in ["/etc/shadow", "/etc/passwd", "/root", {str(secret)!r}, "/work/main",
                     "/sys/fs/cgroup", "/dev/shm"]:
            try:
                print(path, "READ", os.listdir(path) if os.path.isdir(path) else open(path).read())
            except OSError as exc:
                print(path, "denied", exc.strerror)
        """,
    )
    assert result.status == "completed"
    assert "READ" not in result.stdout.replace("/dev/shm READ []", ""), result.stdout
    assert "top secret" not in result.stdout
    # The sandbox's /proc shows its own processes only, and no host path in their environment.
    result = run_python(
        sandbox, "import os; print(os.listdir('/proc'), open('/proc/1/environ').read())"
    )
    assert "sandbox-" not in result.stdout and "/dev/shm" not in result.stdout


def test_writes_outside_scratch_are_refused(sandbox):
    result = run_python(
        sandbox,
        """
        for path in ["/usr/sandbox-escape", "/etc/sandbox-escape", "/sandbox-escape",
                     "/proc/sys/kernel/hostname", "/work/ok", "/tmp/ok"]:
            try:
                open(path, "w").write("x")
                print(path, "written")
            except OSError as exc:
                print(path, "refused")
        """,
    )
    lines = result.stdout.splitlines()
    assert lines[:4] == [
        "/usr/sandbox-escape refused",
        "/etc/sandbox-escape refused",
        "/sandbox-escape refused",
        "/proc/sys/kernel/hostname refused",
    ]
    assert lines[4:] == ["/work/ok written", "/tmp/ok written"]
    assert not os.path.exists("/usr/sandbox-escape")


def test_namespace_escapes_are_denied_by_seccomp(sandbox):
    needs_seccomp()
    result = run_python(
        sandbox,
        """
        import ctypes, errno
        libc = ctypes.CDLL(None, use_errno=True)
        calls = {
            "unshare": lambda: libc.unshare(0x10000000),   # CLONE_NEWUSER
            "ptrace": lambda: libc.ptrace(0, 0, 0, 0),     # PTRACE_TRACEME
            "mount": lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None),
            "bpf": lambda: libc.syscall(321, 0, 0, 0),
        }
        for name, call in calls.items():
            print(name, call(), errno.errorcode[ctypes.get_errno()])
        """,
    )
    assert result.stdout.split("\n")[:4] == [
        "unshare -1 EPERM",
        "ptrace -1 EPERM",
        "mount -1 EPERM",
        "bpf -1 EPERM",
    ]


def test_environment_is_clean(sandbox, monkeypatch):
    monkeypatch.setenv("GATEWAY_TEST_CANARY", "must-not-leak")
    result = run_python(sandbox, "import os; print(sorted(os.environ.items()))")
    assert "must-not-leak" not in result.stdout
    assert eval(result.stdout) == [  # noqa: S307 - our own program's repr
        ("HOME", "/work"),
        ("LANG", "C.UTF-8"),
        ("PATH", "/usr/bin:/bin"),
        ("PWD", "/work"),
    ]


def test_process_count_is_capped(sandbox, survivors):
    result = run_python(
        sandbox,
        """
        import os, time
        started = 0
        for _ in range(1000):
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                started += 1
            except OSError:
                break
        print(started)
        """,
        timeout_s=20,
    )
    assert result.status == "completed"
    assert 0 < int(result.stdout) < isolation.PIDS_MAX
    assert survivors(0, under=os.getpid()) == []


@pytest.mark.parametrize("cgroup_kill", [True, False], ids=["v2-kill", "v1-only"])
def test_fork_bomb_is_contained_and_cleaned_up(sandbox, survivors, monkeypatch, cgroup_kill):
    if not cgroup_kill:  # hosts without a v2 group: the v1 groups' pids are killed instead
        bases = {k: v for k, v in sandbox._cgroups.bases.items() if k != "kill"}
        monkeypatch.setattr(sandbox, "_cgroups", CgroupHost(bases))
    result = sandbox.run(
        Job("bash", "bomb() { bomb | bomb & }; bomb; sleep 60", timeout_s=2), slot=0
    )
    assert result.status in ("timed_out", "failed")
    assert result.duration_ms < 6000
    assert survivors(0, under=os.getpid()) == []


def test_memory_hog_is_oom_killed(sandbox):
    result = run_python(
        sandbox,
        """
        chunks = []
        while True:
            chunks.append(b"x" * (8 << 20))
        """,
        memory_mb=64,
    )
    assert (result.status, result.oom_killed, result.signal) == ("failed", True, 9)


def test_node_memory_hog_is_oom_killed(sandbox):
    needs(sandbox, "node")
    code = "const a = []; for (;;) a.push(Buffer.alloc(8 << 20, 1));"
    result = sandbox.run(Job("node", code, memory_mb=128), slot=0)
    assert (result.status, result.oom_killed) == ("failed", True)


def test_scratch_cannot_fill_the_host(sandbox):
    big_file = run_python(sandbox, "open('/work/big', 'wb').write(b'x' * (20 << 20))")
    assert "File too large" in big_file.stderr  # RLIMIT_FSIZE
    many_files = run_python(
        sandbox,
        """
        for i in range(100):
            open(f"/work/f{i}", "wb").write(b"x" * (8 << 20))
        """,
        memory_mb=64,
    )
    assert many_files.oom_killed  # scratch lives on tmpfs, charged to the memory cgroup


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_flood_is_capped(sandbox, stream):
    result = run_python(
        sandbox, f"import sys\nwhile True: sys.{stream}.write('x' * 65536)", timeout_s=10
    )
    assert len(getattr(result, stream)) == OUTPUT_CAP
    assert getattr(result, f"{stream}_truncated") is True
    assert result.status == "failed"
    assert result.duration_ms < 5000  # killed at the cap, not at the deadline


def test_timeout_kills_background_processes(sandbox, survivors):
    code = "sleep 1000 & setsid sleep 1000 & echo started; sleep 1000"
    result = sandbox.run(Job("bash", code, timeout_s=1), slot=0)
    assert (result.status, result.stdout) == ("timed_out", "started\n")
    assert result.duration_ms < 3000
    assert survivors(0, under=os.getpid()) == []


def test_background_processes_do_not_outlive_the_program(sandbox, survivors):
    code = "sleep 1000 & setsid sleep 1000 & echo done"
    result = sandbox.run(Job("bash", code, timeout_s=10), slot=0)
    assert (result.status, result.stdout) == ("completed", "done\n")
    assert result.duration_ms < 3000
    assert survivors(0, under=os.getpid()) == []


def leftovers(sandbox: Sandbox, pid: int) -> list[str]:
    cgroups = [n for n in sandbox._cgroups.names() if n.startswith(f"{pid}-")]
    prefix = f"{isolation.SCRATCH_PREFIX}{pid}-"
    return cgroups + [n for n in os.listdir(sandbox._scratch_base) if n.startswith(prefix)]


def test_nothing_is_left_behind(sandbox):
    run_python(sandbox, "open('/work/data', 'w').write('x' * 1000)")
    assert leftovers(sandbox, os.getpid()) == []


def test_leftovers_of_a_dead_node_are_removed_at_start(sandbox):
    finished = subprocess.Popen(["true"])
    finished.wait()
    dead_pid = finished.pid  # a node pid that no longer runs
    for base in sandbox._cgroups.bases.values():
        os.mkdir(os.path.join(base, f"{dead_pid}-slot0-deadbeef"))
    os.mkdir(os.path.join(sandbox._scratch_base, f"{isolation.SCRATCH_PREFIX}{dead_pid}-x"))
    live = os.path.join(sandbox._scratch_base, f"{isolation.SCRATCH_PREFIX}{os.getpid()}-live")
    os.mkdir(live)
    try:
        Sandbox(max_concurrent=1)
        assert leftovers(sandbox, dead_pid) == []
        assert os.path.isdir(live)  # a running node's are kept
    finally:
        os.rmdir(live)


async def test_executions_beyond_the_slots_are_refused(sandbox):
    running = [asyncio.create_task(sandbox.execute(Job("bash", "sleep 0.5"))) for _ in range(2)]
    await asyncio.sleep(0.1)
    with pytest.raises(SandboxBusy):
        await sandbox.execute(Job("bash", "true"))
    assert [r.status for r in await asyncio.gather(*running)] == ["completed", "completed"]


def test_without_namespaces_the_node_refuses_unless_degraded(sandbox, monkeypatch):
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    refusing = Sandbox(max_concurrent=1)
    assert (refusing.will_execute, refusing.report["namespaces"]) == (False, False)
    assert "namespaces" in refusing.report["refusal"]
    with pytest.raises(SandboxUnavailable):
        asyncio.run(refusing.execute(Job("bash", "true")))

    degraded = Sandbox(max_concurrent=1, allow_degraded=True)
    assert (degraded.will_execute, degraded.report["degraded"]) == (True, True)
    result = degraded.run(Job("bash", "id -u"), slot=0)
    assert result.stdout == f"{SLOT_UID_BASE}\n"


def test_only_unix_sockets_can_be_created(sandbox):
    needs_seccomp()
    result = run_python(
        sandbox,
        """
        import errno, socket
        families = {"AF_VSOCK": 40, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16,
                    "AF_PACKET": 17, "AF_ALG": 38, "AF_TIPC": 30, "AF_KEY": 15, "AF_RDS": 21,
                    "AF_BLUETOOTH": 31, "AF_XDP": 44, "AF_CAN": 29, "unassigned": 63}
        for name, family in families.items():
            try:
                socket.socket(family, socket.SOCK_STREAM if name != "AF_ALG" else 5).close()
                print(name, "created")
            except OSError as exc:
                print(name, errno.errorcode[exc.errno])
        for name, make in [("socket", lambda: socket.socket(socket.AF_UNIX)),
                           ("socketpair", lambda: socket.socketpair()[0])]:
            make().close()
            print("AF_UNIX", name, "ok")
        try:
            socket.socketpair(socket.AF_INET)
        except OSError as exc:
            print("socketpair AF_INET", errno.errorcode[exc.errno])
        """,
    )
    lines = result.stdout.splitlines()
    assert [line for line in lines if not line.endswith("EAFNOSUPPORT")] == [
        "AF_UNIX socket ok",
        "AF_UNIX socketpair ok",
    ], result.stdout + result.stderr
    assert len(lines) == 16


def test_only_the_runtimes_part_of_usr_is_visible(sandbox):
    result = run_python(
        sandbox,
        """
        import os
        for path in ["/usr/local", "/usr/local/etc", "/usr/share", "/usr/include", "/usr/src",
                     "/usr/sbin", "/usr/lib/systemd", "/usr/lib/node_modules", "/usr/games"]:
            print(path, "visible" if os.path.exists(path) else "absent")
        """,
    )
    assert result.status == "completed", result.stderr
    assert "visible" not in result.stdout, result.stdout
    # What the runtimes and the scripts they run need is still there.
    shell = sandbox.run(Job("bash", "ls / >/dev/null && sleep 0 && echo ok"), slot=0)
    assert (shell.status, shell.stdout) == ("completed", "ok\n"), shell.stderr


def test_a_stop_request_ends_the_run_at_once(sandbox, survivors):
    stop, stopped_at = StopSignal(), []

    def stop_once_running() -> None:  # bash and its two sleeps, however loaded the host
        deadline = time.monotonic() + 10
        while len(survivors(0, grace=0, under=os.getpid())) < 3:
            if time.monotonic() > deadline:
                break  # stop anyway: the assertions below then say what went wrong
            time.sleep(0.02)
        stopped_at.append(time.monotonic())
        stop.request()

    stopper = threading.Thread(target=stop_once_running)
    stopper.start()
    try:
        code = "sleep 1000 & setsid sleep 1000 & echo started; sleep 1000"
        result = sandbox.run(Job("bash", code, timeout_s=30), slot=0, stop=stop)
        returned_at = time.monotonic()
    finally:
        stopper.join()
        stop.close()
    assert result.status == "cancelled"
    assert returned_at - stopped_at[0] < 2  # killed at the request, not at the deadline
    assert 0 < result.duration_ms < 12_000
    assert survivors(0, under=os.getpid()) == []


def test_a_stop_requested_before_the_start_runs_nothing(sandbox):
    stop = StopSignal()
    try:
        stop.request()
        started = time.monotonic()
        result = sandbox.run(Job("bash", "sleep 1000", timeout_s=20), slot=0, stop=stop)
    finally:
        stop.close()
    assert result.status == "cancelled"
    assert time.monotonic() - started < 2
