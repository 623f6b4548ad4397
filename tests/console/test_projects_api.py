"""Projects, keys, sandboxes and payments through the console API, and every 409 of
decisions.md, over real HTTP; keys made in the console are checked on /v1."""

from __future__ import annotations

import httpx
import pytest

from tests.console.support import error_type
from tests.support.http import bearer, chat_body


def test_owner_creates_shows_and_lists_projects(owner):
    created = owner.post(
        "/console/api/projects",
        {"name": "alpha", "monthly_budget": "12.5", "rpm": 30, "allow_models": ["echo-1"]},
    )
    assert created.status_code == 201
    project = created.json()
    assert project["id"].startswith("prj_") and project["state"] == "active"
    assert project["monthly_budget"] == "12.500000" and project["rpm"] == 30
    assert project["balance"] == "0.000000" and project["allow_models"] == ["echo-1"]
    shown = owner.get(f"/console/api/projects/{project['id']}").json()
    assert {"balance", "reserved", "month_spend"} <= set(shown)
    listed = owner.get("/console/api/projects").json()
    assert listed["object"] == "list" and listed["next_cursor"] is None
    assert project["id"] in [p["id"] for p in listed["data"]]


def test_bad_project_fields_are_400_with_param(owner):
    for body, param in [
        ({}, "name"),
        ({"name": "x", "monthly_budget": "abc"}, "monthly_budget"),
        ({"name": "x", "rpm": 0}, "rpm"),
        ({"name": "x", "rpm": 2**63}, "rpm"),  # beyond storage's integers: was a 500
        ({"name": "x", "monthly_budget": "1e30"}, "monthly_budget"),  # the same
        ({"name": "x", "monthly_budget": "1E+999999"}, "monthly_budget"),  # decimal.Overflow
        ({"name": "x", "colour": "red"}, "colour"),
    ]:
        response = owner.post("/console/api/projects", body)
        assert response.status_code == 400, body
        assert response.json()["error"]["param"] == param
    not_json = owner.request("POST", "/console/api/projects", content=b"name=x")
    assert not_json.status_code == 400


def test_patch_changes_budget_rpm_policy_and_null_clears(gateway, owner, project):
    path = f"/console/api/projects/{project['id']}"
    changed = owner.patch(path, {"monthly_budget": "3", "rpm": 7, "exclude_models": ["echo-off"]})
    assert changed.status_code == 200
    assert changed.json()["monthly_budget"] == "3.000000" and changed.json()["rpm"] == 7
    assert changed.json()["exclude_models"] == ["echo-off"]
    cleared = owner.patch(path, {"monthly_budget": None, "rpm": None, "exclude_models": None})
    assert cleared.json()["monthly_budget"] is None and cleared.json()["rpm"] is None
    assert cleared.json()["exclude_models"] == []
    # The CLI sees the same record.
    assert gateway.cli("projects", "show", project["id"])["monthly_budget"] is None


def test_policy_change_applies_to_the_next_v1_request(owner, gateway, funded):
    key = owner.post(
        f"/console/api/projects/{funded['id']}/keys", {"scopes": ["inference"]}
    ).json()["key"]
    url = gateway.url + "/v1/chat/completions"
    assert httpx.post(url, json=chat_body(), headers=bearer(key)).status_code == 200
    owner.patch(f"/console/api/projects/{funded['id']}", {"exclude_models": ["echo-1"]})
    refused = httpx.post(url, json=chat_body(), headers=bearer(key))
    assert refused.status_code == 403 and error_type(refused) == "model_not_allowed"


def test_archive_then_everything_that_writes_is_409(gateway, owner, project):
    pid = project["id"]
    key = owner.post(f"/console/api/projects/{pid}/keys", {"scopes": ["inference"]}).json()
    archived = owner.post(f"/console/api/projects/{pid}/archive")
    assert archived.status_code == 200 and archived.json()["state"] == "archived"
    for method, path, body in [
        ("POST", f"/console/api/projects/{pid}/archive", {}),
        ("PATCH", f"/console/api/projects/{pid}", {"rpm": 5}),
        ("POST", f"/console/api/projects/{pid}/keys", {"scopes": ["inference"]}),
        ("POST", f"/console/api/projects/{pid}/sandboxes", {"runtime": "python"}),
        ("POST", f"/console/api/projects/{pid}/payments", {"amount": "1", "reference": "late"}),
        ("POST", f"/console/api/projects/{pid}/playground/chat/completions", chat_body()),
    ]:
        response = owner.request(method, path, json=body)
        assert response.status_code == 409, (path, response.text)
        assert error_type(response) == "conflict"
    # Still readable; its key gets 403 forbidden on /v1.
    assert owner.get(f"/console/api/projects/{pid}").json()["state"] == "archived"
    assert owner.get(f"/console/api/projects/{pid}/keys").status_code == 200
    v1 = httpx.post(
        gateway.url + "/v1/chat/completions", json=chat_body(), headers=bearer(key["key"])
    )
    assert v1.status_code == 403 and error_type(v1) == "forbidden"


def test_keys_shown_once_listed_without_secret_and_revoked_once(gateway, owner, funded):
    pid = funded["id"]
    created = owner.post(
        f"/console/api/projects/{pid}/keys",
        {
            "scopes": ["inference", "receipts"],
            "name": "ci runner",
            "monthly_limit": "1.5",
            "models": ["echo-1"],
            "rpm": 50,
            "expires_at": "2099-01-01T00:00:00Z",
        },
    )
    assert created.status_code == 201
    key = created.json()
    assert key["key"].startswith("proj_live_") and key["prefix"] == key["key"][:18]
    assert key["monthly_limit"] == "1.500000" and key["name"] == "ci runner"
    assert key["expires_at"] == "2099-01-01T00:00:00Z"
    call = httpx.post(
        gateway.url + "/v1/chat/completions", json=chat_body(), headers=bearer(key["key"])
    )
    assert call.status_code == 200
    listed = owner.get(f"/console/api/projects/{pid}/keys")
    assert key["key"] not in listed.text
    (entry,) = listed.json()["data"]
    assert entry["prefix"] == key["prefix"] and entry["state"] == "usable"
    assert entry["last_used_at"] is not None and entry["month_spend"] != "0.000000"
    revoked = owner.post(f"/console/api/keys/{key['prefix']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    again = owner.post(f"/console/api/keys/{key['prefix']}/revoke")
    assert again.status_code == 409 and error_type(again) == "conflict"
    after = httpx.post(
        gateway.url + "/v1/chat/completions", json=chat_body(), headers=bearer(key["key"])
    )
    assert after.status_code == 401 and error_type(after) == "invalid_api_key"
    assert owner.post("/console/api/keys/proj_live_nOnEXIST/revoke").status_code == 404


def test_bad_key_fields_are_400(owner, project):
    path = f"/console/api/projects/{project['id']}/keys"
    for body, param in [
        ({}, "scopes"),
        ({"scopes": []}, "scopes"),
        ({"scopes": ["wizardry"]}, "scopes"),
        ({"scopes": ["inference"], "expires_at": "soon"}, "expires_at"),
        ({"scopes": [1]}, "scopes"),  # the following were 500s
        ({"scopes": ["inference"], "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"scopes": ["inference"], "expires_at": "9999-12-31T23:59:59-14:00"}, "expires_at"),
        ({"scopes": ["inference"], "monthly_limit": "1E+999999"}, "monthly_limit"),
        ({"scopes": ["inference"], "rpm": 2**63}, "rpm"),
    ]:
        response = owner.post(path, body)
        assert response.status_code == 400, body
        assert response.json()["error"]["param"] == param


def test_members_see_only_granted_projects(gateway, owner, member, member_email, project):
    other = owner.post("/console/api/projects", {"name": "not theirs"}).json()
    gateway.cli("users", "grant", member_email, "--project", project["id"])
    listed = [p["id"] for p in member.get("/console/api/projects").json()["data"]]
    assert listed == [project["id"]]
    assert member.get("/console/api/me").json()["user"]["projects"] == [project["id"]]
    pid = other["id"]
    for method, path in [
        ("GET", f"/console/api/projects/{pid}"),
        ("PATCH", f"/console/api/projects/{pid}"),
        ("GET", f"/console/api/projects/{pid}/keys"),
        ("POST", f"/console/api/projects/{pid}/keys"),
        ("GET", f"/console/api/projects/{pid}/usage"),
        ("GET", f"/console/api/projects/{pid}/receipts"),
        ("GET", f"/console/api/projects/{pid}/ledger"),
        ("GET", f"/console/api/projects/{pid}/sandboxes"),
        ("POST", f"/console/api/projects/{pid}/playground/chat/completions"),
    ]:
        body = chat_body() if "playground" in path else {"scopes": ["inference"]}
        response = member.request(method, path, json=body if method != "GET" else None)
        assert response.status_code == 404, (path, response.text)
        assert error_type(response) == "not_found"
    other_key = owner.post(f"/console/api/projects/{pid}/keys", {"scopes": ["inference"]}).json()
    refused = member.post(f"/console/api/keys/{other_key['prefix']}/revoke")
    assert refused.status_code == 404
    # Within a granted project a member manages keys.
    mine = member.post(f"/console/api/projects/{project['id']}/keys", {"scopes": ["inference"]})
    assert mine.status_code == 201


def test_owner_only_actions_are_403_for_members(gateway, member, member_email, project):
    gateway.cli("users", "grant", member_email, "--project", project["id"])
    pid = project["id"]
    for path, body in [
        ("/console/api/projects", {"name": "mine"}),
        (f"/console/api/projects/{pid}/archive", {}),
        (f"/console/api/projects/{pid}/payments", {"amount": "1", "reference": "m-1"}),
    ]:
        response = member.post(path, body)
        assert response.status_code == 403, path
        assert error_type(response) == "forbidden"


@pytest.mark.parametrize(
    "change",
    [
        {"monthly_budget": "1000"},
        {"monthly_budget": None},
        {"rpm": 100000},
        {"rpm": None},
        {"allow_models": ["echo-1"]},
        {"allow_models": None},
        {"exclude_models": ["echo-1"]},
        {"exclude_models": None},
        {"payer_addresses": ["0x" + "ab" * 20]},
        {"tpm": 1000},  # a field to come: the owner's too
        {"monthly_budget": "not an amount"},  # refused before it is read
    ],
)
def test_members_cannot_patch_a_projects_money_and_limits(
    gateway, owner, member, member_email, change
):
    """Every PATCH field but `name` is the owner's: a member of the project gets 403, and
    the project is unchanged; the member keeps keys and every read."""
    project = owner.post(
        "/console/api/projects",
        {"name": "limits", "monthly_budget": "5", "rpm": 10, "exclude_models": ["echo-off"]},
    ).json()
    gateway.cli("users", "grant", member_email, "--project", project["id"])
    path = f"/console/api/projects/{project['id']}"
    before = owner.get(path).json()
    refused = member.patch(path, change)
    assert refused.status_code == 403, refused.text
    assert error_type(refused) == "forbidden"
    assert owner.get(path).json() == before
    assert member.get(path).status_code == 200
    assert member.post(path + "/keys", {"scopes": ["inference"]}).status_code == 201
    page = member.get(f"/console/projects/{project['id']}")
    assert page.status_code == 200 and "Limits and models" not in page.text
    assert "Limits and models" in owner.get(f"/console/projects/{project['id']}").text


def test_members_may_rename_a_granted_project(gateway, owner, member, member_email):
    """`name` is the one PATCH field that is not the owner's alone (decisions.md)."""
    project = owner.post("/console/api/projects", {"name": "before", "rpm": 10}).json()
    gateway.cli("users", "grant", member_email, "--project", project["id"])
    path = f"/console/api/projects/{project['id']}"
    renamed = member.patch(path, {"name": "after"})
    assert renamed.status_code == 200, renamed.text
    assert owner.get(path).json()["name"] == "after"
    assert owner.get(path).json()["rpm"] == 10
    blank = member.patch(path, {"name": "  "})
    assert blank.status_code == 400 and blank.json()["error"]["param"] == "name"


def test_payments_credit_once_per_reference(gateway, owner, project):
    path = f"/console/api/projects/{project['id']}/payments"
    paid = owner.post(path, {"amount": "20.25", "reference": "INV-2026-001"})
    assert paid.status_code == 201
    assert paid.json()["amount"] == "20.250000" and paid.json()["balance"] == "20.250000"
    assert paid.json()["recorded_by"] == "owner@example.com"
    again = owner.post(path, {"amount": "20.25", "reference": "INV-2026-001"})
    assert again.status_code == 409 and error_type(again) == "conflict"
    shown = owner.get(f"/console/api/projects/{project['id']}").json()
    assert shown["balance"] == "20.250000"
    for body, param in [
        ({"amount": "0", "reference": "x"}, "amount"),
        ({"amount": "-1", "reference": "x"}, "amount"),
        ({"amount": "1"}, "reference"),
    ]:
        response = owner.post(path, body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_sandboxes_list_and_create(owner, project):
    path = f"/console/api/projects/{project['id']}/sandboxes"
    created = owner.post(path, {"runtime": "python", "timeout_s": 5})
    assert created.status_code == 201
    sandbox = created.json()
    assert sandbox["id"].startswith("sbx_") and sandbox["timeout_s"] == 5
    listed = owner.get(path).json()
    assert [s["id"] for s in listed["data"]] == [sandbox["id"]]
    assert owner.post(path, {"runtime": "cobol"}).status_code == 400
    for limits in ({"timeout_s": 10**6}, {"timeout_s": 2**63}, {"memory_mb": 10**9}):
        refused = owner.post(path, {"runtime": "python", **limits})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == next(iter(limits))


def test_purchases_without_configuration_are_503(owner, project):
    response = owner.post(
        f"/console/api/projects/{project['id']}/purchases", {"tx_hash": "0x" + "ab" * 32}
    )
    assert response.status_code == 503 and error_type(response) == "service_unavailable"
    assert "not configured" in response.json()["error"]["message"]


def test_unknown_console_paths_and_methods(owner):
    missing = owner.get("/console/api/nothing-here")
    assert missing.status_code == 404 and error_type(missing) == "not_found"
    wrong = owner.request("DELETE", "/console/api/projects")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, POST"
