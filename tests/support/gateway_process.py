"""A real gateway: `gateway serve` in its own process on loopback, with its own config and
database, administered through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.processes import listens_on

GATEWAY = str(Path(sys.executable).with_name("gateway"))

BASE_CONFIG = """
[server]
host = "127.0.0.1"
port = {port}
environment = "{environment}"
cors_origins = {cors_origins}
{server_extra}

[storage]
url = "{storage_url}"

[secrets]
key_pepper_file = "{secrets_dir}/key-pepper"
signing_key_file = "{secrets_dir}/signing-key"

[limits]
gateway_timeout_s = {gateway_timeout_s}
default_project_rpm = {default_rpm}
default_key_rpm = {default_rpm}

[providers.local]
kind = "echo"

[models."echo-1"]
provider = "local"
upstream = "echo-1"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
supports_tools = true
max_output_tokens = 4096

[models."echo-notools"]
provider = "local"
upstream = "echo-notools"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
supports_tools = false
max_output_tokens = 1024

[models."org/echo-2"]
provider = "local"
upstream = "echo-1"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
max_output_tokens = 1024

[models."echo-off"]
provider = "local"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
available = false
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CliFailed(Exception):
    def __init__(self, code: int, output: dict | None, stderr: str) -> None:
        super().__init__(f"gateway CLI exited {code}: {stderr.strip()}")
        self.code, self.output, self.stderr = code, output, stderr


class GatewayProcess:
    def __init__(
        self,
        folder: Path,
        *,
        extra_config: str = "",
        environment: str = "development",
        cors_origins: list[str] | None = None,
        gateway_timeout_s: float = 120,
        default_rpm: int = 100_000,
        env: dict[str, str] | None = None,
        server_extra: str = "",
        storage_url: str = "sqlite:///data/gateway.db",
        secrets_dir: str = "data",
    ) -> None:
        """Instances of one deployment share `storage_url` (PostgreSQL) and `secrets_dir`
        (an absolute folder): the same key pepper and log key."""
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = folder / "config.toml"
        self.env = {**os.environ, **(env or {})}
        self.config_path.write_text(
            BASE_CONFIG.format(
                port=self.port,
                environment=environment,
                cors_origins=json.dumps(cors_origins or []),
                gateway_timeout_s=gateway_timeout_s,
                default_rpm=default_rpm,
                server_extra=server_extra,
                storage_url=storage_url,
                secrets_dir=secrets_dir,
            )
            + extra_config
        )
        self.log_path = folder / "gateway.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> GatewayProcess:
        log = open(self.log_path, "ab")  # owned by the child for its life
        self.process = subprocess.Popen(
            [GATEWAY, "serve", "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited at start-up:\n{self.log()}")
            try:
                healthy = httpx.get(self.url + "/healthz", timeout=1).status_code == 200
                if healthy and listens_on(self.process.pid, self.port):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"gateway did not answer /healthz:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def kill(self) -> None:
        """kill -9: no shutdown code runs."""
        self.stop(signal.SIGKILL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def cli(self, *args: str, check: bool = True) -> dict:
        """Run `gateway ARGS --config F --json` and return its one JSON object."""
        done = subprocess.run(
            [GATEWAY, *args, "--config", str(self.config_path), "--json"],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )
        output = json.loads(done.stdout) if done.stdout.strip() else None
        if check and done.returncode != 0:
            raise CliFailed(done.returncode, output, done.stderr)
        return output if output is not None else {"exit_code": done.returncode}

    def create_project(self, name: str = "test", *options: str) -> str:
        return self.cli("projects", "create", name, *options)["id"]

    def create_key(self, project_id: str, scopes: str = "inference", *options: str) -> str:
        args = ("--project", project_id, "--scopes", scopes, *options)
        return self.cli("keys", "create", *args)["key"]

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
