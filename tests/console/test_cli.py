"""The console's commands of the real CLI: users, grants, payments and the lists."""

from __future__ import annotations

import subprocess

import pytest

from tests.console.support import create_user
from tests.support.gateway_process import GATEWAY, CliFailed


def test_first_user_is_owner_later_ones_members(gateway):
    # The module's gateway already has owner@example.com.
    import json

    member = json.loads(create_user(gateway, "later@example.com"))
    assert member["role"] == "member" and "password_hash" not in member
    owner2 = json.loads(create_user(gateway, "boss@example.com", "--role", "owner"))
    assert owner2["role"] == "owner"
    users = {u["email"]: u for u in gateway.cli("users", "list")["data"]}
    assert users["owner@example.com"]["role"] == "owner"
    assert users["later@example.com"]["role"] == "member"
    assert "$argon2" not in str(users)


def test_duplicate_email_short_password_and_no_stdin_fail(gateway):
    for args, stdin in [
        (["owner@example.com", "--password-stdin"], "another long password\n"),
        (["short@example.com", "--password-stdin"], "short\n"),
        (["nostdin@example.com"], ""),
    ]:
        done = subprocess.run(
            [GATEWAY, "users", "create", *args, "--config", str(gateway.config_path), "--json"],
            input=stdin,
            capture_output=True,
            text=True,
            env=gateway.env,
            timeout=60,
        )
        assert done.returncode != 0, args
        assert "error" in done.stdout


def test_grant_disable_and_lists(gateway):
    create_user(gateway, "granted@example.com")
    project = gateway.create_project("listed")
    granted = gateway.cli("users", "grant", "granted@example.com", "--project", project)
    assert granted["projects"] == [project]
    with pytest.raises(CliFailed) as missing:
        gateway.cli("users", "grant", "granted@example.com", "--project", "prj_nope")
    assert missing.value.output["error"]["type"] == "not_found"
    disabled = gateway.cli("users", "disable", "granted@example.com")
    assert disabled["disabled"] is True
    projects = gateway.cli("projects", "list")
    assert projects["object"] == "list" and project in [p["id"] for p in projects["data"]]
    key = gateway.cli("keys", "create", "--project", project, "--scopes", "inference")
    keys = gateway.cli("keys", "list", "--project", project)["data"]
    assert [k["prefix"] for k in keys] == [key["prefix"]] and key["key"] not in str(keys)
    with pytest.raises(CliFailed):
        gateway.cli("keys", "list", "--project", "prj_nope")


def test_payment_record_is_a_ledger_payment_once(gateway, owner):
    project = gateway.create_project("paid")
    paid = gateway.cli("payments", "record", "--project", project, "2.5", "--reference", "W-9")
    assert paid["amount"] == "2.500000" and paid["balance"] == "2.500000"
    with pytest.raises(CliFailed) as again:
        gateway.cli("payments", "record", "--project", project, "2.5", "--reference", "W-9")
    assert again.value.output["error"]["type"] == "conflict"
    ledger = owner.get(f"/console/api/projects/{project}/ledger").json()["data"]
    assert [(e["kind"], e["reference"]) for e in ledger] == [("payment", "W-9")]
    # The same reference in another project is another payment.
    other = gateway.create_project("other")
    gateway.cli("payments", "record", "--project", other, "1", "--reference", "W-9")


def test_projects_update_and_keys_update(gateway):
    project = gateway.create_project("updated", "--budget", "9")
    changed = gateway.cli("projects", "update", project, "--rpm", "12", "--budget", "none")
    assert changed["rpm"] == 12 and changed["monthly_budget"] is None
    changed = gateway.cli("projects", "update", project, "--allow-models", "echo-1")
    assert changed["allow_models"] == ["echo-1"] and changed["rpm"] == 12  # the rest unchanged
    key = gateway.cli("keys", "create", "--project", project, "--scopes", "inference")
    updated = gateway.cli(
        "keys", "update", key["prefix"], "--monthly-limit", "2", "--rpm", "3", "--name", "ci"
    )
    assert updated["monthly_limit"] == "2.000000" and updated["rpm"] == 3
    cleared = gateway.cli("keys", "update", key["prefix"], "--monthly-limit", "none")
    assert cleared["monthly_limit"] is None and cleared["rpm"] == 3
    listed = gateway.cli("keys", "list", "--project", project)["data"]
    assert listed[0]["name"] == "ci"
    gateway.cli("keys", "revoke", key["prefix"])
    with pytest.raises(CliFailed) as revoked:
        gateway.cli("keys", "update", key["prefix"], "--rpm", "5")
    assert revoked.value.output["error"]["type"] == "conflict"
    gateway.cli("projects", "archive", project)
    with pytest.raises(CliFailed) as archived:
        gateway.cli("projects", "update", project, "--rpm", "5")
    assert archived.value.output["error"]["type"] == "conflict"
