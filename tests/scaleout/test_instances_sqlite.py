"""SQLite: one serving process, registered and leased like any instance, which sees every
change at its next request (the epoch file): the CLI has nothing to wait for."""

from __future__ import annotations

import time

from tests.scaleout.instances import CLUSTER, chat, owner_of
from tests.support.gateway_process import GatewayProcess


def test_the_cli_returns_at_once_and_names_the_one_process(tmp_path):
    with GatewayProcess(tmp_path, extra_config=CLUSTER) as gw:
        key = gw.create_key(gw.create_project("one", "--balance", "5"))
        assert chat(gw, key).status_code == 200

        started = time.monotonic()
        revoked = gw.cli("keys", "revoke", key)
        assert time.monotonic() - started < 5  # a process start, no wait for a lease

        assert revoked["instances"]["confirmed"] == [owner_of(gw)]
        assert revoked["instances"]["waited_ms"] < 100
        assert chat(gw, key).status_code == 401
