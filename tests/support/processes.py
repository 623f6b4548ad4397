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
