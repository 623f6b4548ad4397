"""How `gateway serve` starts its children (a spawned sandbox node, the log process, its
workers):
kept free of heavy imports, because the command line reads it on every start."""

from __future__ import annotations

import ctypes
import signal
import sys

# The single binary (`make dist`) has no `python -m`: it runs a child by its first argument.
SANDBOX_NODE_ARG = "--run-spawned-sandbox-node"
LOG_PROCESS_ARG = "--run-log-process"
WORKER_ARG = "--run-worker"
_MODULES = {
    SANDBOX_NODE_ARG: "model_gateway.gateway.sandbox.supervisor",
    LOG_PROCESS_ARG: "model_gateway.gateway.proofs.log_process",
    WORKER_ARG: "model_gateway.gateway.ops.worker",
}
_PR_SET_PDEATHSIG = 1


def child_command(frozen_arg: str) -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable, frozen_arg]
    return [sys.executable, "-m", _MODULES[frozen_arg]]


def die_with_parent() -> None:
    """(preexec_fn) The kernel sends the child SIGTERM when the gateway dies, even by kill -9."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
