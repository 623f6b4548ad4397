"""`gateway doctor` over a real deployment: every failure it names, in plain words, and a
clean bill of health once everything is in place. Exit 1 only for what stops serving;
the rest is a warning (decisions.md, "Hardening III")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.sandbox_e2e.helpers import NodeProcess, sandbox_config
from tests.support.gateway_process import GATEWAY, GatewayProcess, free_port


def doctor(process: GatewayProcess, env: dict[str, str] | None = None) -> tuple[int, dict]:
    done = subprocess.run(
        [GATEWAY, "doctor", "--config", str(process.config_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**process.env, **(env or {})},
    )
    return done.returncode, json.loads(done.stdout)


def problems(report: dict, level: str = "problem") -> dict[str, str]:
    return {c["name"]: c["detail"] for c in report["checks"] if c["level"] == level}


def warnings(report: dict) -> dict[str, str]:
    return problems(report, "warning")


CREDENTIAL = """
[providers.remote]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "GATEWAY_DOCTOR_TEST_KEY"

[models."remote-1"]
provider = "remote"
input_price_per_mtok = "1"
output_price_per_mtok = "1"
"""


@pytest.fixture
def served(tmp_path):
    """A deployment that has been served once (database and secrets exist)."""
    process = GatewayProcess(tmp_path, extra_config=CREDENTIAL)
    process.start()
    process.stop()
    return process


def test_a_healthy_deployment_passes(served):
    code, report = doctor(served, {"GATEWAY_DOCTOR_TEST_KEY": "sk-test"})
    assert (code, problems(report), report["ok"]) == (0, {}, True)
    names = {c["name"] for c in report["checks"]}
    assert {"config", "storage", "key pepper", "signing key", "provider remote"} <= names


def test_a_missing_credential_names_the_variable(served):
    code, report = doctor(served, {"GATEWAY_DOCTOR_TEST_KEY": ""})
    assert code == 1
    assert problems(report) == {
        "provider remote": "GATEWAY_DOCTOR_TEST_KEY is not set: requests to remote-1 answer 503"
    }


KINDS = """
[providers.aws]
kind = "bedrock"
region = "us-east-1"
access_key_env = "GATEWAY_DOCTOR_AWS_KEY"
secret_key_env = "GATEWAY_DOCTOR_AWS_SECRET"

[providers.aws-chain]
kind = "bedrock"
region = "us-east-1"

[providers.gcp]
kind = "vertex"
project = "p"
credentials_file = "secrets/none-such.json"

[providers.gcp-adc]
kind = "vertex"
project = "p"

[providers.gem]
kind = "gemini"
api_key_env = "GATEWAY_DOCTOR_GEMINI_KEY"
"""
# No credentials anywhere a library's default chain looks: no variables, no home files,
# no metadata servers.
NO_CHAIN = {
    "GATEWAY_DOCTOR_AWS_KEY": "",
    "GATEWAY_DOCTOR_AWS_SECRET": "",
    "GATEWAY_DOCTOR_GEMINI_KEY": "",
    "AWS_ACCESS_KEY_ID": "",
    "AWS_SECRET_ACCESS_KEY": "",
    "AWS_EC2_METADATA_DISABLED": "true",
    "GOOGLE_APPLICATION_CREDENTIALS": "",
    "NO_GCE_CHECK": "True",
}


def test_each_kind_names_its_missing_credential(tmp_path):
    """A named variable or file by its name; a library's default chain that finds nothing
    by what would make it find some (decisions.md, "Upstream providers")."""
    process = GatewayProcess(tmp_path, extra_config=KINDS)
    process.start()
    process.stop()
    home = tmp_path / "home"
    home.mkdir()
    env = {**NO_CHAIN, "HOME": str(home), "CLOUDSDK_CONFIG": str(home / "gcloud")}
    code, report = doctor(process, env)
    found = warnings(report)  # no available model needs them: warnings, not problems
    assert code == 0
    assert found["provider aws"].startswith("GATEWAY_DOCTOR_AWS_KEY is not set")
    assert found["provider gem"].startswith("GATEWAY_DOCTOR_GEMINI_KEY is not set")
    assert str(tmp_path / "secrets" / "none-such.json") in found["provider gcp"]
    assert (
        "botocore's default credential chain found no AWS credentials"
        in found["provider aws-chain"]
    )
    assert "no Google application default credentials" in found["provider gcp-adc"]


def test_a_secret_readable_by_others_is_named_with_the_fix(served):
    pepper = served.folder / "data" / "key-pepper"
    pepper.chmod(0o644)
    _, report = doctor(served, {"GATEWAY_DOCTOR_TEST_KEY": "sk-test"})
    assert problems(report) == {
        "key pepper": f"{pepper} is mode 0644: others can read it; chmod 0600"
    }


def test_a_deployment_never_served_says_serve_creates_it(tmp_path):
    """What `gateway serve` creates on its first start does not stop it: warnings."""
    process = GatewayProcess(tmp_path, extra_config=CREDENTIAL + "available = false\n")
    code, report = doctor(process)
    assert (code, report["ok"], problems(report)) == (0, True, {})
    found = warnings(report)
    assert "`gateway serve` creates it" in found["storage"]
    assert "`gateway serve` creates it" in found["key pepper"]
    assert (
        found["provider remote"]
        == "GATEWAY_DOCTOR_TEST_KEY is not set: no available model needs it"
    )
    assert report["warnings"] == len(found)


SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "config.toml"


def test_a_fresh_install_of_the_shipped_config_passes_with_warnings(tmp_path):
    """The shipped config.toml names OpenAI and Anthropic as examples, without credentials:
    a fresh install (nothing served yet, no provider variable set) can serve echo-1."""
    shutil.copy(SHIPPED_CONFIG, tmp_path / "config.toml")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    done = subprocess.run(
        [GATEWAY, "doctor", "--config", str(tmp_path / "config.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PROBLEM" not in done.stdout
    assert "WARNING  provider openai: OPENAI_API_KEY is not set" in done.stdout
    assert "WARNING  storage: the database does not exist yet" in done.stdout


def test_a_spawned_node_not_running_yet_is_a_warning(tmp_path):
    """spawn = true: the node starts with `gateway serve`; doctor run beside a stopped
    gateway finds nothing on its port, and that stops nothing."""
    url = f"http://127.0.0.1:{free_port()}"
    process = GatewayProcess(tmp_path, extra_config=sandbox_config(url, tmp_path / "s", spawn=True))
    code, report = doctor(process)
    assert code == 0 and "sandbox node" not in problems(report)
    assert warnings(report)["sandbox node"].startswith(f"{url} is not reachable")


def test_a_broken_config_is_named_and_nothing_else_is_checked(tmp_path):
    process = GatewayProcess(tmp_path)
    process.config_path.write_text(process.config_path.read_text() + "\n[server]\nprot = 1\n")
    code, report = doctor(process)
    assert code == 1
    assert [c["name"] for c in report["checks"]] == ["config"]
    assert "server" in report["checks"][0]["detail"]


def test_an_unreachable_node_is_named(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    process = GatewayProcess(tmp_path, extra_config=sandbox_config(url, tmp_path / "s"))
    _, report = doctor(process)
    assert problems(report)["sandbox node"].startswith(f"{url} is not reachable")


def test_a_reachable_isolated_node_passes(tmp_path):
    node = NodeProcess(tmp_path).start()
    try:
        process = GatewayProcess(tmp_path, extra_config=sandbox_config(node.url, node.secret_file))
        _, report = doctor(process)
    finally:
        node.stop()
    assert "sandbox node" not in problems(report)
    check = next(c for c in report["checks"] if c["name"] == "sandbox node")
    assert check["detail"].startswith("reachable and isolated")
