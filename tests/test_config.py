"""config.toml: typos and wrong types fail at start naming the key, paths resolve against
the file's folder, GATEWAY_CONFIG selects the file, unconfigured providers answer 503."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from model_gateway.gateway.config import ConfigError, load_config, parse_config
from tests.support.errors import assert_error
from tests.support.gateway_process import GATEWAY, GatewayProcess
from tests.support.http import bearer, chat_body

ECHO = '[providers.local]\nkind = "echo"\n[models."echo-1"]\nprovider = "local"\n'


def failure(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return str(caught.value)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[server]\nprot = 8080\n", "server.prot"),
        ("[server]\nport = 8080\nenviroment = 'production'\n", "server.enviroment"),
        ("[limits]\ngateway_timeout = 5\n", "limits.gateway_timeout"),
        ("[secrets]\nkey_pepper = 'x'\n", "secrets.key_pepper"),
        ("[servr]\nport = 8080\n", "servr"),
        (ECHO + "prise = 1\n", "models.echo-1.prise"),
        (
            ECHO + '[models."gpt-4.1"]\nprovider = "local"\nsupports_tool = true\n',
            'models."gpt-4.1".supports_tool',
        ),
        ('[providers.local]\nkind = "echo"\nbase_ur = "http://x"\n', "providers.local.base_ur"),
    ],
)
def test_a_typoed_key_is_named_in_the_error(text, named):
    message = failure(text)
    assert f"`{named}`" in message, message


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[server]\nport = "8080"\n', "server.port"),
        ('[server]\ncors_origins = "https://a.example"\n', "server.cors_origins"),
        ('[server]\nenvironment = "staging"\n', "server.environment"),
        ('[limits]\ndefault_key_rpm = "many"\n', "limits.default_key_rpm"),
        ("[storage]\nurl = 5\n", "storage.url"),
        (ECHO + 'input_price_per_mtok = "cheap"\n', "models.echo-1.input_price_per_mtok"),
        (ECHO + 'available = "yes"\n', "models.echo-1.available"),
        ('[providers.local]\nkind = "llama"\n', "providers.local.kind"),
    ],
)
def test_a_wrong_type_or_value_is_named_in_the_error(text, named):
    message = failure(text)
    assert f"`{named}`" in message, message


def test_a_model_naming_an_unknown_provider_fails():
    message = failure(ECHO + '[models."gpt-x"]\nprovider = "openia"\n')
    assert "models.gpt-x.provider" in message and "openia" in message


@pytest.mark.parametrize(
    ("block", "base_url"),
    [
        ('kind = "openai"', "https://api.openai.com/v1"),
        ('kind = "anthropic"', "https://api.anthropic.com"),
        ('kind = "gemini"\napi_key_env = "K"', "https://generativelanguage.googleapis.com"),
        ('kind = "vertex"\nproject = "p"', "https://us-central1-aiplatform.googleapis.com"),
        ('kind = "vertex"\nproject = "p"\nlocation = "europe-west4"',
         "https://europe-west4-aiplatform.googleapis.com"),
        ('kind = "bedrock"\nregion = "eu-west-1"', "https://bedrock-runtime.eu-west-1.amazonaws.com"),
        ('kind = "vertex"\nproject = "p"\nlocation = "global"', "https://aiplatform.googleapis.com"),
    ],
)
def test_a_provider_without_base_url_reaches_its_vendor(block, base_url):
    config = parse_config(f"[providers.remote]\n{block}\n")
    assert config.providers["remote"].base_url == base_url


@pytest.mark.parametrize(
    ("block", "named"),
    [
        ('kind = "azure"\napi_key_env = "K"', "base_url"),  # a resource's own address
        ('kind = "azure"\nbase_url = "https://x"', "api_key_env"),
        ('kind = "gemini"', "api_key_env"),
        ('kind = "vertex"', "project"),
        ('kind = "bedrock"', "region"),
        ('kind = "bedrock"\nregion = "r"\naccess_key_env = "A"', "secret_key_env"),
        ('kind = "bedrock"\nregion = "r"\napi_key_env = "A"', "api_key_env"),
        ('kind = "openai"\nregion = "eu-west-1"', "region"),  # another kind's key
        ('kind = "openai"\napi_version = "2025-01-01"', "api_version"),
        ('kind = "openai"\nheaders = {"bad name" = "x"}', "headers"),
        ('kind = "openai"\nheaders = {"X-A" = "a\\r\\nInjected: 1"}', "headers"),
    ],
)
def test_a_provider_missing_or_misplacing_a_key_fails(block, named):
    message = failure(f"[providers.remote]\n{block}\n")
    assert "providers.remote" in message and named in message, message


def test_a_named_credential_that_is_missing_is_not_configured(tmp_path, monkeypatch):
    monkeypatch.delenv("MISSING_AWS_KEY", raising=False)
    config = parse_config(
        '[providers.b]\nkind = "bedrock"\nregion = "r"\n'
        'access_key_env = "MISSING_AWS_KEY"\nsecret_key_env = "MISSING_AWS_KEY"\n'
        '[providers.v]\nkind = "vertex"\nproject = "p"\ncredentials_file = "sa.json"\n'
        '[providers.chain]\nkind = "bedrock"\nregion = "r"\n',
        base_dir=tmp_path,
    )
    assert config.providers["b"].not_ready_because() == "MISSING_AWS_KEY is not set"
    why = config.providers["v"].not_ready_because()
    assert why is not None and str(tmp_path / "sa.json") in why  # resolved beside the file
    (tmp_path / "sa.json").write_text("{}")
    assert config.providers["v"].not_ready_because() is None
    assert config.providers["chain"].not_ready_because() is None  # botocore's chain decides


def test_aliases_are_unique_across_models():
    two = ECHO + '[models.a]\nprovider = "local"\naliases = ["x"]\n'
    message = failure(two + '[models.b]\nprovider = "local"\naliases = ["x"]\n')
    assert "models.b.aliases" in message and "'x'" in message
    message = failure(two + '[models.b]\nprovider = "local"\naliases = ["a"]\n')
    assert "models.b.aliases" in message


def test_invalid_toml_fails_with_the_file_named(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[server\nport = 1\n")
    with pytest.raises(ConfigError, match=r"config\.toml"):
        load_config(path)


def test_a_missing_file_fails_with_its_path(tmp_path):
    with pytest.raises(ConfigError, match=r"nowhere\.toml"):
        load_config(tmp_path / "nowhere.toml")


def _serve_fails(config_path: Path, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [GATEWAY, "serve", "--config", str(config_path)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0, done
    return done


def test_serve_with_a_typo_fails_at_start_naming_the_key(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[server]\nhost = "127.0.0.1"\nprot = 8080\n' + ECHO)
    done = _serve_fails(path, tmp_path)
    assert "server.prot" in done.stderr + done.stdout
    assert not (tmp_path / "data").exists()  # failed before touching anything


def test_serve_with_an_unknown_provider_fails_at_start(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(ECHO + '[models."m"]\nprovider = "ghost"\n')
    done = _serve_fails(path, tmp_path)
    assert "models.m.provider" in done.stderr + done.stdout


def test_relative_paths_resolve_against_the_config_files_folder(tmp_path, monkeypatch):
    folder = tmp_path / "etc" / "gateway"
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(
        '[storage]\nurl = "sqlite:///data/gw.db"\n'
        '[secrets]\nkey_pepper_file = "secrets/pepper"\nsigning_key_file = "../signing"\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config("../etc/gateway/config.toml")
    assert config.storage_url == f"sqlite:///{folder / 'data' / 'gw.db'}"
    assert config.path(config.secrets.key_pepper_file) == folder / "secrets" / "pepper"
    assert config.path(config.secrets.signing_key_file) == tmp_path / "etc" / "signing"


def test_an_absolute_sqlite_url_is_kept(tmp_path):
    config = parse_config(
        f'[storage]\nurl = "sqlite:///{tmp_path}/abs.db"\n', base_dir=tmp_path / "x"
    )
    assert config.storage_url == f"sqlite:///{tmp_path}/abs.db"


def test_gateway_config_selects_the_file_and_an_explicit_path_wins(tmp_path, monkeypatch):
    chosen = tmp_path / "chosen.toml"
    chosen.write_text("[server]\nport = 9191\n")
    other = tmp_path / "other.toml"
    other.write_text("[server]\nport = 9292\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.toml").write_text("[server]\nport = 9393\n")
    monkeypatch.delenv("GATEWAY_CONFIG", raising=False)
    assert load_config().server.port == 9393  # the default: ./config.toml
    monkeypatch.setenv("GATEWAY_CONFIG", str(chosen))
    assert load_config().server.port == 9191
    assert load_config(other).server.port == 9292


def test_the_cli_reads_gateway_config_and_writes_next_to_that_file(tmp_path):
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "config.toml").write_text(ECHO)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "GATEWAY_CONFIG": str(folder / "config.toml")}
    done = subprocess.run(
        [GATEWAY, "projects", "create", "via-env", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (folder / "data" / "gateway.db").exists()
    assert not (cwd / "data").exists()


UNSET = "GATEWAY_TEST_REMOTE_KEY_NEVER_SET"
REMOTE = f"""
[providers.remote]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "{UNSET}"

[models."remote-1"]
provider = "remote"
input_price_per_mtok = "1"
output_price_per_mtok = "2"
supports_tools = true
"""


@pytest.fixture(scope="module")
def unconfigured(tmp_path_factory):
    assert UNSET not in os.environ
    with GatewayProcess(tmp_path_factory.mktemp("unconfigured"), extra_config=REMOTE) as process:
        project = process.create_project("remote", "--balance", "10")
        process.key = process.create_key(project, "inference")
        yield process


def test_a_provider_without_its_credential_is_not_configured_and_the_server_starts(
    unconfigured,
):
    with httpx.Client(base_url=unconfigured.url, headers=bearer(unconfigured.key)) as http:
        listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert listed["remote-1"]["available"] is False
        assert listed["echo-1"]["available"] is True
        for path, body in (
            ("/v1/chat/completions", chat_body("remote-1")),
            ("/v1/responses", {"model": "remote-1", "input": "hi"}),
        ):
            assert_error(http.post(path, json=body), 503, "service_unavailable")
        # The deployment's other models still answer.
        assert http.post("/v1/chat/completions", json=chat_body("echo-1")).status_code == 200


def test_the_request_head_limits_default_to_the_decided_values():
    server = parse_config("").server
    assert (server.max_head_bytes, server.head_timeout_s, server.body_timeout_s) == (65536, 30, 60)


def test_the_shipped_config_names_the_request_head_limits():
    shipped = Path(__file__).resolve().parents[1] / "config.toml"
    server = load_config(shipped).server
    assert (server.max_head_bytes, server.head_timeout_s, server.body_timeout_s) == (65536, 30, 60)
    text = shipped.read_text()
    for key in ("max_head_bytes", "head_timeout_s", "body_timeout_s"):
        assert f"\n{key} = " in text, key


def test_the_request_head_limits_are_read_from_the_file():
    server = parse_config(
        "[server]\nmax_head_bytes = 8192\nhead_timeout_s = 2.5\nbody_timeout_s = 5\n"
    ).server
    assert (server.max_head_bytes, server.head_timeout_s, server.body_timeout_s) == (8192, 2.5, 5)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[server]\nmax_head_bytes = "64k"\n', "server.max_head_bytes"),
        ("[server]\nmax_head_bytes = 100\n", "server"),  # would refuse every request
        ("[server]\nhead_timeout_s = 0\n", "server"),
        ("[server]\nbody_timeout_s = -1\n", "server"),
        ('[server]\nbody_timeout_s = "never"\n', "server.body_timeout_s"),
    ],
)
def test_a_request_head_limit_out_of_range_is_refused(text, named):
    message = failure(text)
    assert f"`{named}`" in message, message
