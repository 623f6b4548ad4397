"""Tokens per minute through the console, over real HTTP: the JSON field `tpm` on projects
and keys (create, show, list, PATCH, null clears), bad values 400 naming `tpm`, a member's
PATCH of it 403, the pages showing it, and a key made in the console limited by it on /v1."""

from __future__ import annotations

import httpx

from tests.console.support import error_type
from tests.support.http import bearer, chat_body

BAD_TPMS = [0, -1, "many", 1.5, True, [1000], 2**31, 2**63]


def test_a_projects_tpm_is_created_shown_listed_changed_and_cleared(owner):
    created = owner.post("/console/api/projects", {"name": "tokens", "rpm": 30, "tpm": 90_000})
    assert created.status_code == 201, created.text
    project = created.json()
    assert (project["rpm"], project["tpm"]) == (30, 90_000)
    path = f"/console/api/projects/{project['id']}"
    assert owner.get(path).json()["tpm"] == 90_000
    listed = owner.get("/console/api/projects").json()["data"]
    assert [p["tpm"] for p in listed if p["id"] == project["id"]] == [90_000]
    changed = owner.patch(path, {"tpm": 7})
    assert changed.status_code == 200 and (changed.json()["rpm"], changed.json()["tpm"]) == (30, 7)
    assert owner.patch(path, {"tpm": None}).json()["tpm"] is None
    plain = owner.post("/console/api/projects", {"name": "no tokens"}).json()
    assert plain["tpm"] is None  # no token limit


def test_a_keys_tpm_is_created_and_listed_beside_its_rpm(owner, project):
    path = f"/console/api/projects/{project['id']}/keys"
    created = owner.post(path, {"scopes": ["inference"], "rpm": 50, "tpm": 4_000})
    assert created.status_code == 201, created.text
    assert (created.json()["rpm"], created.json()["tpm"]) == (50, 4_000)
    (listed,) = owner.get(path).json()["data"]
    assert (listed["rpm"], listed["tpm"]) == (50, 4_000)
    page = owner.get(f"/console/projects/{project['id']}/keys").text
    assert "<th>TPM</th>" in page and "4000" in page


def test_bad_tpm_values_are_400_naming_tpm(owner, project):
    for bad in BAD_TPMS:
        refused = [
            owner.post("/console/api/projects", {"name": "x", "tpm": bad}),
            owner.patch(f"/console/api/projects/{project['id']}", {"tpm": bad}),
            owner.post(
                f"/console/api/projects/{project['id']}/keys", {"scopes": ["inference"], "tpm": bad}
            ),
        ]
        for response in refused:
            assert response.status_code == 400, (bad, response.text)
            assert response.json()["error"]["param"] == "tpm"
    assert owner.get(f"/console/api/projects/{project['id']}").json()["tpm"] is None
    assert owner.get(f"/console/api/projects/{project['id']}/keys").json()["data"] == []


def test_a_member_may_not_change_a_projects_tpm(gateway, owner, member, member_email):
    project = owner.post("/console/api/projects", {"name": "limits", "tpm": 1000}).json()
    gateway.cli("users", "grant", member_email, "--project", project["id"])
    refused = member.patch(f"/console/api/projects/{project['id']}", {"tpm": 10**6})
    assert refused.status_code == 403 and error_type(refused) == "forbidden"
    assert member.get(f"/console/api/projects/{project['id']}").json()["tpm"] == 1000


def test_the_overview_shows_and_offers_the_projects_tpm(owner):
    project = owner.post("/console/api/projects", {"name": "shown", "tpm": 12_345}).json()
    page = owner.get(f"/console/projects/{project['id']}").text
    assert "Tokens per minute" in page and "12345" in page
    assert 'name="tpm"' in page  # the owner's limits form


def test_a_key_made_in_the_console_is_limited_by_its_tpm_on_v1(gateway, owner, funded):
    body = chat_body()
    created = owner.post(
        f"/console/api/projects/{funded['id']}/keys", {"scopes": ["inference"], "tpm": 50}
    ).json()

    def chat() -> httpx.Response:
        return httpx.post(
            gateway.url + "/v1/chat/completions", json=body, headers=bearer(created["key"])
        )

    assert chat().status_code == 200  # a full bucket: it passes, taking the whole minute
    refused = chat()
    assert refused.status_code == 429 and error_type(refused) == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
