"""The peers of `realistic.py --peers` (`make bench PEERS=1`): LiteLLM's proxy from PyPI in
a venv of its own and Portkey's gateway from npm, both under bench/.peers (git ignores
it), installed on first use, each configured to forward to the bench's mock upstream.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gateway_target import MODEL, UPSTREAM_ENV
from load import BENCH_DIR
from procs import Server, StartError, free_port

PEERS = BENCH_DIR / ".peers"
LITELLM = "litellm[proxy]==1.108.7"
PORTKEY = "@portkey-ai/gateway@1.15.2"
LITELLM_KEY = "sk-bench-litellm"
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 90  # LiteLLM's proxy imports for a long time


def _run(argv: list[str], cwd: Path) -> None:
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise StartError(f"`{' '.join(argv)}` failed: {error}") from error
    if done.returncode != 0:
        raise StartError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr[-300:]}")


def _litellm_venv() -> Path:
    venv = PEERS / "litellm-venv"
    if not (venv / "bin" / "litellm").exists():
        PEERS.mkdir(exist_ok=True)
        _run([sys.executable, "-m", "venv", str(venv)], PEERS)
        _run([str(venv / "bin" / "pip"), "install", "-q", LITELLM], PEERS)
    return venv


def _portkey() -> Path:
    package = PEERS / "node_modules" / "@portkey-ai" / "gateway"
    if not (package / "build" / "start-server.js").exists():
        PEERS.mkdir(exist_ok=True)
        _run(["npm", "install", "--no-audit", "--no-fund", PORTKEY], PEERS)
    return package


def start_litellm(folder: Path, upstream: str) -> tuple[Server, dict[str, str], str]:
    """LiteLLM's proxy, one worker, the bench model routed to the mock as an OpenAI model."""
    venv = _litellm_venv()
    config = folder / "litellm.yaml"
    model = {
        "model_name": MODEL,
        "litellm_params": {
            "model": "openai/" + MODEL,
            "api_base": upstream,
            "api_key": "os.environ/BENCH_UPSTREAM_KEY",
        },
    }
    settings = {"model_list": [model], "general_settings": {"master_key": LITELLM_KEY}}
    config.write_text(json.dumps(settings))  # YAML reads JSON
    port = free_port()
    argv = [str(venv / "bin" / "litellm"), "--config", str(config), "--port", str(port)]
    argv += ["--host", "127.0.0.1", "--num_workers", "1"]
    server = Server(argv, port, folder / "litellm.log", env=UPSTREAM_ENV, cwd=folder)
    try:
        server.wait_healthy(START_TIMEOUT_S, "/health/liveliness")
    except StartError:
        server.stop()
        raise
    ask = "import importlib.metadata as m; print(m.version('litellm'))"
    python = str(venv / "bin" / "python")
    version = subprocess.run(
        [python, "-c", ask], capture_output=True, text=True, check=False
    ).stdout.strip()
    return server, {"authorization": "Bearer " + LITELLM_KEY}, version


def start_portkey(folder: Path, upstream: str) -> tuple[Server, dict[str, str], str]:
    """Portkey's gateway on node, told per request to forward to the mock as OpenAI."""
    package = _portkey()
    port = free_port()
    argv = ["node", str(package / "build" / "start-server.js"), f"--port={port}", "--headless"]
    server = Server(argv, port, folder / "portkey.log", env=UPSTREAM_ENV, cwd=folder)
    try:
        server.wait_healthy(START_TIMEOUT_S, "/")
    except StartError:
        server.stop()
        raise
    headers = {
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": upstream,
        "authorization": "Bearer " + UPSTREAM_ENV["BENCH_UPSTREAM_KEY"],
    }
    version = json.loads((package / "package.json").read_text())["version"]
    return server, headers, version
