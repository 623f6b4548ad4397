"""The gateway as a bench target: its config.toml, `gateway serve`, a project and a key.

Follows /work/shared/spec/decisions.md: `gateway serve --config F`, then
`gateway projects create ... --json` and `gateway keys create ... --json`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from procs import Server, StartError, free_port

MODEL = "bench-1"
UPSTREAM_KEY_ENV = "BENCH_UPSTREAM_KEY"
UPSTREAM_ENV = {UPSTREAM_KEY_ENV: "bench-upstream-key"}
BENCH_DIR = Path(__file__).resolve().parent
HIGH_RPM = 100_000_000
START_TIMEOUT_S = 15

CONFIG = """\
[server]
host = "127.0.0.1"
port = {port}
environment = "development"
cors_origins = []

[storage]
url = "sqlite:///gw.db"

[secrets]
key_pepper_file = "key-pepper"
signing_key_file = "signing-key"

[limits]
gateway_timeout_s = 120
default_project_rpm = {rpm}
default_key_rpm = {rpm}

[providers.mock]
kind = "openai"
base_url = "{upstream}"
api_key_env = "{key_env}"

[models."{model}"]
provider = "mock"
upstream = "{model}"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
supports_tools = true
max_output_tokens = 256
available = true

[sandbox_node]
url = "http://127.0.0.1:{sandbox_port}"
secret_file = "sandbox-secret"
max_concurrent = 4
spawn = false
"""

SQLITE_STORAGE = '[storage]\nurl = "sqlite:///gw.db"\n\n'

METERING_OFF = """
[metering]
enabled = false
"""


def write_config(folder: Path, port: int, upstream: str, metering: bool, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = CONFIG.format(
        port=port,
        rpm=HIGH_RPM,
        upstream=upstream,
        model=MODEL,
        key_env=UPSTREAM_KEY_ENV,
        sandbox_port=free_port(),
    )
    config = folder / "config.toml"
    # `extra` may hold keys of [server] (a table TOML lets one declare only once) and tables;
    # a [storage] table of its own replaces SQLite's (a PostgreSQL gateway).
    server_keys, _, tables = (
        ("", "", extra[1:]) if extra.startswith("[") else extra.partition("\n[")
    )
    if tables.startswith("storage]") or "\n[storage]" in tables:
        text = text.replace(SQLITE_STORAGE, "", 1)
    text = text.replace("[server]\n", "[server]\n" + server_keys + "\n", 1)
    config.write_text(
        (text if metering else text + METERING_OFF) + ("\n[" + tables if tables else "")
    )
    return config


def cli_field(gateway: Path, config: Path, name: str, *args: str) -> str:
    """Run `gateway ARGS --json --config F`; the field `name` of the object it prints."""
    argv = [str(gateway), *args, "--json", "--config", str(config)]
    command = " ".join(argv[1:])
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=config.parent,
            env={**os.environ, **UPSTREAM_ENV},
        )
    except subprocess.TimeoutExpired as error:
        raise StartError(f"`gateway {command}` did not finish within 60 s") from error
    if done.returncode != 0:
        raise StartError(
            f"`gateway {command}` exited with {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-400:]}"
        )
    try:
        return str(json.loads(done.stdout)[name])
    except (json.JSONDecodeError, TypeError, KeyError) as error:
        raise StartError(
            f"`gateway {command}` printed no JSON object with {name!r}: "
            f"{done.stdout.strip()[-200:]!r}"
        ) from error


def start_gateway(
    gateway: Path, folder: Path, upstream: str, metering: bool, extra: str = ""
) -> tuple[Server, str]:
    """Start a gateway (config `extra` appended) with a funded project and a key."""
    if not gateway.exists():
        raise StartError(f"{gateway} not found (install the project: pip install -e .)")
    port = free_port()
    config = write_config(folder, port, upstream, metering, extra)
    server = Server(
        [str(gateway), "serve", "--config", str(config)],
        port,
        folder / "gateway.log",
        env=UPSTREAM_ENV,
        cwd=folder,
    )
    try:
        server.wait_healthy(START_TIMEOUT_S)
        project = cli_field(
            gateway,
            config,
            "id",
            "projects",
            "create",
            "bench",
            "--balance",
            "1000000",
            "--rpm",
            str(HIGH_RPM),
        )
        key = cli_field(
            gateway,
            config,
            "key",
            "keys",
            "create",
            "--project",
            project,
            "--scopes",
            "inference",
            "--models",
            MODEL,
            "--rpm",
            str(HIGH_RPM),
        )
    except BaseException:
        server.stop()
        raise
    return server, key


def start_mock(folder: Path, *args: str) -> Server:
    """The mock upstream (bench/mock_upstream.py, given `args`), started; the caller stops it."""
    port = free_port()
    mock = Server(
        [sys.executable, str(BENCH_DIR / "mock_upstream.py"), "--port", str(port), *args],
        port,
        folder / "mock.log",
        env=UPSTREAM_ENV,
    )
    mock.wait_healthy()
    return mock


@contextlib.contextmanager
def metered_gateway(
    gateway: Path, folder: Path, extra: str = "", mock_args: tuple[str, ...] = ()
) -> Iterator[tuple[Server, str, Path]]:
    """A mock upstream (`mock_args`) and a metered gateway in front of it on a fresh SQLite
    database in `folder` (unless `extra`, config lines, names another storage): the gateway,
    its key and its database file; both stopped on the way out."""
    servers = [start_mock(folder, *mock_args)]
    try:
        server, key = start_gateway(gateway, folder / "gw", servers[0].url + "/v1", True, extra)
        servers.append(server)
        yield server, key, folder / "gw" / "gw.db"
    finally:
        for running in reversed(servers):
            running.stop()
