"""The `gateway` command line, run as a real process against its own config and database."""

from __future__ import annotations

import contextlib
import io
import json
import re
import stat
import subprocess
from pathlib import Path

import pytest

from model_gateway.gateway.access import keys
from model_gateway.gateway.cli import main
from tests.support.gateway_process import GATEWAY, GatewayProcess


@pytest.fixture
def cli(tmp_path) -> GatewayProcess:
    """A deployment folder with its config; the server is not started: the CLI needs none."""
    return GatewayProcess(tmp_path)


def run(
    process: GatewayProcess, *args: str, json_out: bool = True, input: str | None = None
) -> subprocess.CompletedProcess:
    """The installed `gateway` command, in its own process."""
    argv = [GATEWAY, *args, "--config", str(process.config_path)]
    return subprocess.run(
        [*argv, "--json"] if json_out else argv,
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        env=process.env,
    )


def call(process: GatewayProcess, *args: str, json_out: bool = True) -> subprocess.CompletedProcess:
    """The same CLI (gateway.cli.main) in this process: a subprocess costs ~0.4 s of imports."""
    argv = [*args, "--config", str(process.config_path), *(["--json"] if json_out else [])]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def one_object(done: subprocess.CompletedProcess) -> dict:
    """stdout holds exactly one JSON object, on one line, and nothing else."""
    assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1, done.stdout
    record = json.loads(done.stdout)
    assert isinstance(record, dict)
    return record


def data_files(process: GatewayProcess) -> dict[str, bytes]:
    """Every database file (main, WAL, shared memory), never the secret files."""
    folder = process.folder / "data"
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith("gateway.db")}


def record(process: GatewayProcess, *args: str) -> dict:
    done = call(process, *args)
    assert done.returncode == 0, done.stderr
    return one_object(done)


def new_project(process: GatewayProcess) -> str:
    return record(process, "projects", "create", "acme")["id"]


def new_key(process: GatewayProcess, project: str) -> str:
    return record(process, "keys", "create", "--project", project, "--scopes", "inference")["key"]


def test_projects_create_show_archive_each_print_one_json_object(cli):
    created = one_object(
        run(
            cli,
            "projects",
            "create",
            "acme",
            "--budget",
            "25",
            "--rpm",
            "60",
            "--allow-models",
            "echo-1,echo-notools",
            "--exclude-models",
            "echo-off",
        )
    )
    assert re.fullmatch(r"prj_\w+", created["id"])
    assert created["name"] == "acme" and created["state"] == "active"
    assert created["rpm"] == 60
    assert created["allow_models"] == ["echo-1", "echo-notools"]
    assert created["exclude_models"] == ["echo-off"]
    shown = one_object(run(cli, "projects", "show", created["id"]))
    for field in (
        "id",
        "name",
        "state",
        "balance",
        "monthly_budget",
        "month_spend",
        "reserved",
        "rpm",
    ):
        assert field in shown, field
    assert shown["id"] == created["id"]
    assert float(shown["monthly_budget"]) == 25  # an amount is a decimal string
    assert isinstance(shown["monthly_budget"], str)
    archived = one_object(run(cli, "projects", "archive", created["id"]))
    assert archived["state"] == "archived"
    assert one_object(run(cli, "projects", "show", created["id"]))["state"] == "archived"


def test_keys_create_revoke_show_each_print_one_json_object(cli):
    project = cli.create_project("acme")
    created = one_object(
        run(
            cli,
            "keys",
            "create",
            "--project",
            project,
            "--scopes",
            "inference,receipts",
            "--models",
            "echo-1",
            "--monthly-limit",
            "5",
            "--rpm",
            "30",
            "--expires-at",
            "2999-01-01T00:00:00Z",
        )
    )
    key = created["key"]
    assert keys.is_well_formed(key)
    assert created["prefix"] == key[:18] == keys.public_prefix(key)
    assert re.fullmatch(r"key_\w+", created["id"])
    assert created["project"] == project
    assert created["scopes"] == ["inference", "receipts"]
    assert created["state"] == "usable"
    shown = one_object(run(cli, "keys", "show", created["prefix"]))
    for field in ("prefix", "project", "scopes", "state", "month_spend"):
        assert field in shown, field
    assert shown["prefix"] == created["prefix"] and shown["project"] == project
    revoked = one_object(run(cli, "keys", "revoke", created["prefix"]))
    assert revoked["state"] == "revoked"
    assert one_object(run(cli, "keys", "show", created["prefix"]))["state"] == "revoked"


def test_keys_revoke_takes_the_whole_key_but_never_a_made_up_one(cli):
    project = new_project(cli)
    key = one_object(call(cli, "keys", "create", "--project", project, "--scopes", "inference"))[
        "key"
    ]
    forged = key[:18] + keys.generate_key()[18:]  # the real prefix, another secret
    refused = call(cli, "keys", "revoke", forged)
    assert refused.returncode != 0 and json.loads(refused.stdout)["error"]["type"] == "not_found"
    assert one_object(call(cli, "keys", "show", key[:18]))["state"] == "usable"
    revoked = one_object(call(cli, "keys", "revoke", key))
    assert revoked["state"] == "revoked" and key not in json.dumps(revoked)


def test_the_key_is_printed_once_at_creation_and_never_again(cli):
    project = new_project(cli)
    created = call(cli, "keys", "create", "--project", project, "--scopes", "inference")
    key = one_object(created)["key"]
    secret_part = key[len(keys.KEY_PREFIX) :]
    assert created.stdout.count(key) == 1
    prefix = keys.public_prefix(key)
    later = [
        call(cli, "keys", "show", prefix),
        call(cli, "keys", "show", prefix, json_out=False),
        call(cli, "keys", "revoke", prefix),
        call(cli, "keys", "show", prefix),
        call(cli, "keys", "revoke", prefix),  # fails: nor in the error
        call(cli, "projects", "show", project),
    ]
    for done in later:
        for text in (done.stdout, done.stderr):
            assert key not in text
            assert secret_part not in text
            assert secret_part[8:] not in text  # the part that is never public


def test_the_plain_output_prints_the_key_once_too(cli):
    project = new_project(cli)
    done = call(
        cli, "keys", "create", "--project", project, "--scopes", "inference", json_out=False
    )
    assert done.returncode == 0
    found = re.findall(r"proj_live_[A-Za-z0-9]{32}", done.stdout)
    assert len(found) == 1 and keys.is_well_formed(found[0])


def test_the_database_never_holds_a_key_in_clear_nor_the_pepper(cli):
    project = new_project(cli)
    made = [new_key(cli, project) for _ in range(3)]
    record(cli, "keys", "revoke", keys.public_prefix(made[0]))
    pepper_text = (cli.folder / "data" / "key-pepper").read_text().strip()
    pepper = bytes.fromhex(pepper_text)
    files = data_files(cli)
    assert "gateway.db" in files
    everything = b"".join(files.values())
    for key in made:
        # The public prefix is stored (lookups use it): the search does see the keys' rows.
        assert keys.public_prefix(key).encode() in everything
    for name, content in files.items():
        for key in made:
            random_part = key[len(keys.KEY_PREFIX) :]
            assert key.encode() not in content, name
            assert random_part.encode() not in content, name
            assert random_part[8:].encode() not in content, name
        assert pepper not in content, name
        assert pepper_text.encode() not in content, name
        assert pepper_text.upper().encode() not in content, name


def test_the_pepper_file_is_created_0600_and_outside_the_database(cli):
    pepper = cli.folder / "data" / "key-pepper"
    assert not pepper.exists()
    project = cli.create_project("acme")
    cli.create_key(project, "inference")
    assert stat.S_IMODE(pepper.stat().st_mode) == 0o600
    assert len(bytes.fromhex(pepper.read_text().strip())) >= 16


def test_the_server_creates_its_pepper_0600_on_first_start(gateway):
    pepper = Path(gateway.folder) / "data" / "key-pepper"
    assert stat.S_IMODE(pepper.stat().st_mode) == 0o600


def _fails(done: subprocess.CompletedProcess, meaning: str) -> str:
    assert done.returncode != 0, done
    assert done.stderr.strip(), "a failure explains itself on stderr"
    error = one_object(done)["error"]
    assert error["type"] == meaning, error
    return error["message"]


def test_revoking_twice_fails_with_a_conflict(cli):
    project = new_project(cli)
    prefix = keys.public_prefix(new_key(cli, project))
    assert call(cli, "keys", "revoke", prefix).returncode == 0
    message = _fails(call(cli, "keys", "revoke", prefix), "conflict")
    assert prefix in message
    plain = call(cli, "keys", "revoke", prefix, json_out=False)
    assert plain.returncode != 0 and plain.stdout == ""


def test_archiving_twice_fails_with_a_conflict(cli):
    project = new_project(cli)
    assert call(cli, "projects", "archive", project).returncode == 0
    _fails(call(cli, "projects", "archive", project), "conflict")


def test_unknown_records_fail_with_not_found(cli):
    _fails(call(cli, "keys", "revoke", "proj_live_nothere0"), "not_found")
    _fails(call(cli, "projects", "archive", "prj_nothere"), "not_found")
    _fails(
        call(cli, "keys", "create", "--project", "prj_nothere", "--scopes", "inference"),
        "not_found",
    )


def test_showing_unknown_records_fails_with_not_found(cli):
    _fails(call(cli, "keys", "show", "proj_live_nothere0"), "not_found")
    _fails(call(cli, "projects", "show", "prj_nothere"), "not_found")


@pytest.mark.parametrize("scopes", ["", " , ", "admin", "inference,admin"])
def test_a_key_needs_known_scopes(cli, scopes):
    project = new_project(cli)
    _fails(call(cli, "keys", "create", "--project", project, "--scopes", scopes), "invalid_request")


def test_tpm_is_set_shown_and_changed_on_projects_and_keys(cli):
    project = record(cli, "projects", "create", "acme", "--rpm", "60", "--tpm", "90000")
    assert (project["rpm"], project["tpm"]) == (60, 90000)
    assert record(cli, "projects", "show", project["id"])["tpm"] == 90000
    created = record(
        cli, "keys", "create", "--project", project["id"], "--scopes", "inference",
        "--rpm", "30", "--tpm", "5000",
    )  # fmt: skip
    assert (created["rpm"], created["tpm"]) == (30, 5000)
    assert record(cli, "keys", "show", created["prefix"])["tpm"] == 5000
    listed = record(cli, "keys", "list", "--project", project["id"])["data"]
    assert [(k["rpm"], k["tpm"]) for k in listed] == [(30, 5000)]
    changed = record(cli, "projects", "update", project["id"], "--tpm", "7")
    assert (changed["rpm"], changed["tpm"]) == (60, 7)
    assert record(cli, "projects", "update", project["id"], "--tpm", "none")["tpm"] is None
    assert record(cli, "keys", "update", created["prefix"], "--tpm", "9")["tpm"] == 9
    cleared = record(cli, "keys", "update", created["prefix"], "--tpm", "none")
    assert (cleared["rpm"], cleared["tpm"]) == (30, None)
    plain = call(cli, "projects", "show", project["id"], json_out=False)
    assert "tpm: -" in plain.stdout.splitlines()
    unset = record(cli, "projects", "create", "plain")
    assert unset["tpm"] is None  # no token limit


@pytest.mark.parametrize("value", ["0", "-3", "many", "1.5"])
def test_a_bad_tpm_is_a_usage_error_like_a_bad_rpm(cli, value):
    project = new_project(cli)
    prefix = keys.public_prefix(new_key(cli, project))
    for words in (
        ["projects", "create", "acme"],
        ["keys", "create", "--project", project, "--scopes", "inference"],
        ["projects", "update", project],
        ["keys", "update", prefix],
    ):
        for flag in ("--rpm", "--tpm"):
            done = call(cli, *words, f"{flag}={value}")
            assert done.returncode == 2, (words, flag)
            assert flag in _fails(done, "invalid_request")


def test_a_tpm_beyond_what_storage_holds_is_refused_naming_the_flag(cli):
    project = new_project(cli)
    prefix = keys.public_prefix(new_key(cli, project))
    for words in (
        ["projects", "create", "acme"],
        ["keys", "create", "--project", project, "--scopes", "inference"],
        ["projects", "update", project],
        ["keys", "update", prefix],
    ):
        done = call(cli, *words, "--tpm", str(2**31))
        assert "--tpm must be a positive integer" in _fails(done, "invalid_request"), words
    assert record(cli, "projects", "show", project)["tpm"] is None
