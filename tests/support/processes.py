"""Host processes seen through /proc, for tests that check nothing a sandbox ran survives."""

from __future__ import annotations

import os
from collections.abc import Callable


def live_processes(uid_matches: Callable[[int], bool]) -> list[int]:
    """Pids of live (not zombie) processes whose real uid matches."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status)
        except (FileNotFoundError, ProcessLookupError):
            continue
        if uid_matches(int(fields["Uid"].split()[0])) and fields["State"].split()[0] != "Z":
            found.append(int(entry))
    return found


def listens_on(pid: int, port: int) -> bool:
    """Whether process `pid` itself holds the listening socket of 127.0.0.1:`port`.

    A port from `free_port()` can be taken by another test's server between the probe and
    the child's bind (the child then exits with "address already in use"): a health check
    alone would be answered by that other server."""
    wanted = f"0100007F:{port:04X}"
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in list(table)[1:]:
            fields = line.split()
            if fields[1] == wanted and fields[3] == "0A":  # LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or not ours to read
        return False
    for fd in descriptors:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False
