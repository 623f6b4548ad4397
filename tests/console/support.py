"""A signed-in console client over real HTTP, and the CLI calls the console tests need."""

from __future__ import annotations

import subprocess

import httpx

from tests.support.gateway_process import GATEWAY, GatewayProcess

PASSWORD = "correct horse battery staple"


def create_user(gateway: GatewayProcess, email: str, *options: str, password: str = PASSWORD):
    done = subprocess.run(
        [
            GATEWAY,
            "users",
            "create",
            email,
            "--password-stdin",
            *options,
            "--config",
            str(gateway.config_path),
            "--json",
        ],
        input=password + "\n",
        capture_output=True,
        text=True,
        env=gateway.env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class ConsoleClient:
    """An httpx client that keeps the session cookie, and remembers every body it saw."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.gateway = gateway
        self.http = httpx.Client(base_url=gateway.url, timeout=30)
        self.seen: list[str] = []

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        response = self.http.request(method, path, **kwargs)
        self.seen.append(response.text + str(response.headers))
        return response

    def get(self, path: str, **kwargs) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, json=None, **kwargs) -> httpx.Response:
        return self.request("POST", path, json=json if json is not None else {}, **kwargs)

    def patch(self, path: str, json, **kwargs) -> httpx.Response:
        return self.request("PATCH", path, json=json, **kwargs)

    def login(self, email: str, password: str = PASSWORD) -> httpx.Response:
        return self.post("/console/api/login", {"email": email, "password": password})

    @property
    def session(self) -> str | None:
        return self.http.cookies.get("console_session")

    def close(self) -> None:
        self.http.close()


def error_type(response: httpx.Response) -> str:
    return response.json()["error"]["type"]
