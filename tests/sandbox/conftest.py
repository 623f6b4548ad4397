import os
import time

import pytest

from gateway.sandbox.isolation import SLOT_UID_BASE, Sandbox
from tests.support.processes import live_processes


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    """The real isolation of this host; skips only when the host truly lacks it."""
    if os.geteuid() != 0:
        pytest.skip("sandbox isolation needs root (to switch to per-slot uids)")
    box = Sandbox(max_concurrent=2)
    if not box.will_execute:
        pytest.skip(f"{box.refusal}; probe notes: {box.report['notes']}")
    return box


@pytest.fixture
def survivors():
    """Returns the live host processes of a slot's uid: none may outlive an execution.

    Processes already killed may take a moment to finish exiting: a short grace.
    """

    def alive(slot: int, grace: float = 1.0) -> list[int]:
        deadline = time.monotonic() + grace
        while (found := _processes_of(SLOT_UID_BASE + slot)) and time.monotonic() < deadline:
            time.sleep(0.02)
        return found

    return alive


def _processes_of(uid: int) -> list[int]:
    return live_processes(lambda found: found == uid)
