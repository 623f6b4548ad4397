"""[console.oidc] in the config: the issuer's scheme by environment, and PyJWT imported
only when single sign-on is configured."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from model_gateway.gateway.config import ConfigError, parse_config


def _config(issuer: str, environment: str = "development") -> str:
    return f"""
[server]
environment = "{environment}"
[console.oidc]
issuer = "{issuer}"
client_id = "console"
"""


@pytest.mark.parametrize(
    ("issuer", "environment"),
    [
        ("https://login.example.com", "production"),
        ("https://login.example.com/realms/team", "development"),
        ("http://127.0.0.1:9000", "development"),
        ("http://localhost:9000/idp", "development"),
    ],
)
def test_an_https_or_local_development_issuer_is_accepted(issuer, environment):
    config = parse_config(_config(issuer, environment))
    assert config.console.oidc is not None
    assert config.console.oidc.issuer == issuer
    assert config.console.oidc.default_role == "member"
    assert config.console.oidc.allowed_email_domains == []


@pytest.mark.parametrize(
    ("issuer", "environment", "message"),
    [
        ("http://127.0.0.1:9000", "production", "must be https"),
        ("http://localhost:9000", "production", "must be https"),
        ("http://login.example.com", "development", "must be https"),
        ("ftp://login.example.com", "development", "must be https"),
        ("login.example.com", "development", "without query or fragment"),
        ("https://login.example.com/?tenant=1", "production", "without query or fragment"),
    ],
)
def test_another_issuer_is_refused_at_start_up(issuer, environment, message):
    with pytest.raises(ConfigError, match=message) as refused:
        parse_config(_config(issuer, environment))
    assert "console.oidc.issuer" in str(refused.value)


def test_unknown_keys_and_roles_are_refused():
    with pytest.raises(ConfigError, match=r"console\.oidc"):
        parse_config(_config("https://login.example.com") + 'default_role = "admin"\n')
    with pytest.raises(ConfigError, match=r"unknown key `console\.oidc\.client_secret`"):
        parse_config(_config("https://login.example.com") + 'client_secret = "inline"\n')


_STARTED = """
import asyncio, sys
from model_gateway.gateway.app import create_app
from model_gateway.gateway.config import parse_config

async def main():
    config = parse_config(sys.argv[1], base_dir=sys.argv[2])
    app = create_app(config)
    async with app.lifespan():  # started: the console mounted, its routes built
        pass
    print("jwt" in sys.modules)

asyncio.run(main())
"""


@pytest.mark.parametrize("configured", [False, True])
def test_pyjwt_is_imported_only_with_single_sign_on(tmp_path, configured):
    text = _config("http://127.0.0.1:9") if configured else ""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_STARTED), text, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(configured)
