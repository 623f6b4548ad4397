import os
import time

import pytest

from model_gateway.gateway.sandbox.node.isolation import SLOT_UID_BASE, Sandbox
from tests.sandbox_e2e.helpers import descendants
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

    Processes already killed may take a moment to finish exiting: a short grace. With
    `under`, only that process's descendants count: other test runs on this host run
    nodes with the same slot uids.
    """

    def alive(slot: int, grace: float = 1.0, under: int | None = None) -> list[int]:
        deadline = time.monotonic() + grace
        while (found := _processes_of(SLOT_UID_BASE + slot, under)) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.02)
        return found

    return alive


def _processes_of(uid: int, under: int | None) -> list[int]:
    found = live_processes(lambda seen: seen == uid)
    if under is None:
        return found
    return [pid for pid in found if pid in descendants(under)]
