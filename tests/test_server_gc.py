"""`gateway serve` tunes the garbage collector once started, before the first request
(gateway/ops/server.py, `tune_garbage_collector`)."""

from __future__ import annotations

import subprocess
import sys

from model_gateway.gateway.app import create_app
from model_gateway.gateway.config import parse_config
from tests.support.configs import EMBEDDED


async def test_the_started_hook_runs_once_before_the_server_is_told_it_started(tmp_path):
    events: list[str] = []
    app = create_app(
        parse_config(EMBEDDED, base_dir=tmp_path), on_started=lambda: events.append("hook")
    )
    incoming = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive():
        return next(incoming)

    async def send(message):
        events.append(message["type"])

    await app({"type": "lifespan"}, receive, send)
    assert events == ["hook", "lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_tuning_freezes_what_exists_and_collects_the_young_rarely():
    # In a process of its own: the tuning is for the whole interpreter.
    probe = (
        "import gc\n"
        "from model_gateway.gateway.ops.server import (\n"
        "    YOUNG_COLLECTION_AFTER, tune_garbage_collector,\n"
        ")\n"
        "assert gc.get_freeze_count() == 0\n"
        "tune_garbage_collector()\n"
        "print(gc.get_threshold()[0] == YOUNG_COLLECTION_AFTER > 700, gc.get_freeze_count())\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    raised, frozen = done.stdout.split()
    assert raised == "True"
    assert int(frozen) > 1000  # at least the imported modules' objects
