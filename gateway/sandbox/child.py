"""How `gateway serve` starts its spawned sandbox node: kept free of imports, because the
command line reads it on every start."""

from __future__ import annotations

import sys

# The single binary (`make dist`) has no `python -m`: it runs the child by this first argument.
FROZEN_CHILD_ARG = "--run-spawned-sandbox-node"


def child_command() -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable, FROZEN_CHILD_ARG]
    return [sys.executable, "-m", "model_gateway.gateway.sandbox.supervisor"]
