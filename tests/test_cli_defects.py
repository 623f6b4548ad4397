"""Operator-facing defects of the `gateway` command line (issue 11) and the modes of the
files the CLI and the server create. Every test runs the real CLI against a real
database in its own folder."""

from __future__ import annotations

import json
import re
import sqlite3
import stat
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.console.support import ConsoleClient, create_user
from tests.support.gateway_process import GatewayProcess
from tests.test_cli import call, new_project, one_object, record, run

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(tmp_path) -> GatewayProcess:
    return GatewayProcess(tmp_path)


@pytest.fixture
def production(tmp_path) -> GatewayProcess:
    return GatewayProcess(tmp_path, environment="production")


def rows(process: GatewayProcess, table: str) -> int:
    """Rows of a table in the deployment's real database (0 when it was never made)."""
    path = process.folder / "data" / "gateway.db"
    if not path.exists():
        return 0
    with sqlite3.connect(path) as db:
        return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608


def failed_with(done: subprocess.CompletedProcess, meaning: str) -> str:
    assert done.returncode != 0, done
    assert done.stderr.strip(), "a failure explains itself on stderr"
    error = one_object(done)["error"]
    assert error["type"] == meaning, error
    assert isinstance(error["message"], str) and error["message"]
    return error["message"]


def test_a_project_with_a_balance_in_production_is_refused_before_it_is_created(production):
    done = call(production, "projects", "create", "acme", "--balance", "5")
    assert "production" in failed_with(done, "forbidden")
    assert rows(production, "projects") == 0  # no project whose id was never printed


def test_a_project_without_a_balance_is_still_created_in_production(production):
    assert record(production, "projects", "create", "acme")["state"] == "active"


@pytest.mark.parametrize("when", ["2020-01-01T00:00:00Z", "past second"])
def test_a_key_that_expired_before_it_was_made_is_refused(cli, when):
    project = new_project(cli)
    if when == "past second":
        when = datetime.fromtimestamp(int(time.time()) - 1, UTC).isoformat()
    done = call(
        cli, "keys", "create", "--project", project, "--scopes", "inference", "--expires-at", when
    )
    assert "past" in failed_with(done, "invalid_request")
    assert rows(cli, "api_keys") == 0


def test_a_key_expiring_later_shows_as_expired_once_that_time_passes(cli):
    project = new_project(cli)
    soon = datetime.fromtimestamp(int(time.time()) + 2, UTC).isoformat()
    created = record(
        cli, "keys", "create", "--project", project, "--scopes", "inference", "--expires-at", soon
    )
    assert created["state"] == "usable"
    time.sleep(2.5)
    assert record(cli, "keys", "show", created["prefix"])["state"] == "expired"


def test_no_key_is_made_for_an_archived_project(cli):
    project = new_project(cli)
    record(cli, "projects", "archive", project)
    done = call(cli, "keys", "create", "--project", project, "--scopes", "inference")
    assert project in failed_with(done, "conflict")
    assert rows(cli, "api_keys") == 0


def test_no_credit_goes_to_an_archived_project(cli):
    project = new_project(cli)
    record(cli, "credit", "add", "--project", project, "3")
    record(cli, "projects", "archive", project)
    done = call(cli, "credit", "add", "--project", project, "5")
    assert project in failed_with(done, "conflict")
    assert float(record(cli, "projects", "show", project)["balance"]) == 3


@pytest.mark.parametrize(
    "words",
    [
        ["projects", "create"],  # NAME missing
        ["projects", "create", "acme", "--rpm", "zero"],
        ["projects", "create", "acme", "--budget", "lots"],
        ["projects", "frobnicate"],
        ["keys", "create", "--project", "prj_x"],  # --scopes missing
        ["keys", "create", "--project", "prj_x", "--scopes", "inference", "--expires-at", "soon"],
        ["credit", "add", "--project", "prj_x", "abc"],
        ["projects", "show", "prj_x", "--colour"],
    ],
)
def test_an_argument_error_with_json_prints_the_error_object(cli, words):
    done = call(cli, *words)  # call() adds --config and --json
    assert done.returncode not in (0, None)
    error = failed_with(done, "invalid_request")
    assert "usage:" not in done.stdout
    assert len(error) < 300, error


def test_the_installed_command_prints_the_error_object_too(cli):
    done = run(cli, "projects", "create", "acme", "--rpm", "-3")
    assert done.returncode != 0
    assert "must be a positive integer" in failed_with(done, "invalid_request")


def test_without_json_an_argument_error_prints_usage_on_stderr(cli):
    done = run(cli, "projects", "create", json_out=False)
    assert done.returncode == 2 and done.stdout == ""
    assert "usage:" in done.stderr and "NAME" in done.stderr.upper()


def test_build_artifacts_are_ignored_by_git():
    # `pip install .` leaves build/ (and a wheel build leaves dist/ and *.egg-info/).
    paths = [
        "build/lib/model_gateway/cli.py",
        "dist/model_gateway-0.1.0.whl",
        "model_gateway.egg-info/PKG-INFO",
    ]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True
    )
    assert sorted(done.stdout.split()) == sorted(paths), done.stdout + done.stderr


def modes(folder: Path, skip: set[str]) -> dict[str, str]:
    """Every path the process made under `folder`, with its kind and permission bits."""
    return {
        str(
            path.relative_to(folder)
        ): f"{'d' if path.is_dir() else 'f'}{stat.S_IMODE(path.stat().st_mode):o}"
        for path in folder.rglob("*")
        if path.name not in skip
    }


def assert_private(found: dict[str, str]) -> None:
    assert "data/gateway.db" in found, found
    for name, mode in found.items():
        assert mode in ("d700", "f600"), f"{name}: {mode}"


def test_every_file_the_cli_creates_is_the_operators_alone(cli):
    new_project(cli)
    assert_private(modes(cli.folder, skip={"config.toml"}))


def test_every_file_the_server_creates_is_the_operators_alone(tmp_path):
    with GatewayProcess(tmp_path):
        # Read while it runs: the WAL and shared-memory files exist only then.
        found = modes(tmp_path, skip={"config.toml", "gateway.log"})
    assert {"data/gateway.db-wal", "data/gateway.db-shm", "data/signing-key"} <= set(found)
    assert_private(found)


# ESC (C0), DEL and CSI (C1, U+009B), and a newline that would start a forged line.
HOSTILE = "\x1b[31mred\x1b]0;title\x07\x7f\u009b2J\nbalance: 1000000"
TERMINAL_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def test_no_command_lets_a_name_steer_the_operators_terminal(tmp_path):
    """Hardening III: names made in the console (or by API clients) reach the operator's
    terminal through every human-readable command, escaped; --json keeps them exact."""
    with GatewayProcess(tmp_path) as gateway:
        create_user(gateway, "owner@example.com")
        console = ConsoleClient(gateway)
        assert console.login("owner@example.com").status_code == 200
        made = console.post("/console/api/projects", {"name": HOSTILE})
        assert made.status_code == 201, made.text
        console.close()
    project = made.json()["id"]
    prefix = record(gateway, "keys", "create", "--project", project, "--scopes", "inference")[
        "prefix"
    ]
    outputs = [
        run(gateway, "projects", "list", json_out=False),
        run(gateway, "projects", "show", project, json_out=False),
        run(gateway, "keys", "update", prefix, "--name", HOSTILE, json_out=False),
        run(gateway, "keys", "list", "--project", project, json_out=False),
        run(gateway, "users", "create", f"a{HOSTILE}@example.com", "--password-stdin",
            json_out=False, input="correct horse battery staple\n"),
        run(gateway, "users", "list", json_out=False),
        run(gateway, "payments", "record", "--project", project, "1", "--reference", HOSTILE,
            json_out=False),
        run(gateway, "projects", "show", HOSTILE, json_out=False),  # the error names it
    ]  # fmt: skip
    for done in outputs:
        text = done.stdout + done.stderr
        assert not TERMINAL_CONTROLS.findall(text), (done.args, text)
        assert "\nbalance: 1000000" not in text, "a value started a line of its own"
    assert outputs[0].stdout.count("\\u001b[31mred") == 1
    assert "\\u009b2J\\u000abalance: 1000000" in outputs[1].stdout
    assert outputs[-1].returncode == 1 and "\\u001b[31mred" in outputs[-1].stderr
    listed = json.loads(run(gateway, "projects", "list").stdout)["data"]
    assert [p["name"] for p in listed] == [HOSTILE]
