"""Sign-in, sessions and the console's boundaries, over real HTTP against `gateway serve`."""

from __future__ import annotations

import httpx

from tests.console.support import PASSWORD, ConsoleClient, error_type
from tests.support.http import bearer, chat_body


def test_wrong_password_and_unknown_email_answer_alike(gateway):
    client = ConsoleClient(gateway)
    wrong = client.login("owner@example.com", "not the password at all")
    unknown = client.login("nobody@example.com", PASSWORD)
    assert wrong.status_code == unknown.status_code == 401
    assert error_type(wrong) == error_type(unknown) == "unauthenticated"
    assert wrong.json()["error"]["message"] == unknown.json()["error"]["message"]
    assert "set-cookie" not in wrong.headers
    assert client.get("/console/api/me").status_code == 401


def test_login_sets_a_strict_http_only_console_cookie(gateway):
    client = ConsoleClient(gateway)
    response = client.login("owner@example.com")
    assert response.status_code == 200
    assert response.json()["user"]["email"] == "owner@example.com"
    assert response.json()["user"]["role"] == "owner"
    cookie = response.headers["set-cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "samesite", "path"} <= attributes
    assert "SameSite=Strict" in cookie and "Path=/console" in cookie
    assert "secure" not in attributes  # development: plain http on loopback
    me = client.get("/console/api/me")
    assert me.status_code == 200 and me.json()["user"]["email"] == "owner@example.com"


def test_every_json_endpoint_needs_a_session(gateway, project):
    anonymous = httpx.Client(base_url=gateway.url)
    pid = project["id"]
    for method, path in [
        ("GET", "/console/api/me"),
        ("POST", "/console/api/logout"),
        ("GET", "/console/api/projects"),
        ("POST", "/console/api/projects"),
        ("GET", f"/console/api/projects/{pid}"),
        ("PATCH", f"/console/api/projects/{pid}"),
        ("POST", f"/console/api/projects/{pid}/archive"),
        ("GET", f"/console/api/projects/{pid}/keys"),
        ("POST", f"/console/api/projects/{pid}/keys"),
        ("POST", "/console/api/keys/proj_live_abcdefgh/revoke"),
        ("GET", f"/console/api/projects/{pid}/usage"),
        ("GET", f"/console/api/projects/{pid}/receipts"),
        ("GET", f"/console/api/projects/{pid}/ledger"),
        ("GET", f"/console/api/projects/{pid}/sandboxes"),
        ("POST", f"/console/api/projects/{pid}/sandboxes"),
        ("POST", f"/console/api/projects/{pid}/payments"),
        ("POST", f"/console/api/projects/{pid}/purchases"),
        ("POST", f"/console/api/projects/{pid}/playground/chat/completions"),
        ("POST", f"/console/api/projects/{pid}/playground/responses"),
        ("POST", f"/console/api/projects/{pid}/playground/sandbox/executions"),
    ]:
        response = anonymous.request(method, path, json={"model": "echo-1", "messages": []})
        assert response.status_code == 401, (method, path, response.text)
        assert error_type(response) == "unauthenticated", (method, path)
        assert response.headers["x-request-id"] == response.json()["error"]["request_id"]


def test_pages_without_a_session_redirect_to_sign_in(gateway):
    response = httpx.get(gateway.url + "/console/projects", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/console/login"


def test_a_new_session_id_at_sign_in_and_the_old_one_is_dead(gateway):
    client = ConsoleClient(gateway)
    client.login("owner@example.com")
    before = client.session
    again = client.login("owner@example.com")  # the browser still sends `before`
    assert again.status_code == 200
    after = client.session
    assert after and before and after != before
    stale = httpx.get(gateway.url + "/console/api/me", cookies={"console_session": before})
    assert stale.status_code == 401
    # A session id an attacker planted is never adopted either.
    planted = httpx.post(
        gateway.url + "/console/api/login",
        json={"email": "owner@example.com", "password": PASSWORD},
        headers={"cookie": "console_session=planted-by-someone"},
    )
    assert planted.status_code == 200
    assert planted.cookies["console_session"] not in ("", "planted-by-someone")


def test_logout_ends_the_session_on_the_server(gateway):
    client = ConsoleClient(gateway)
    client.login("owner@example.com")
    token = client.session
    response = client.post("/console/api/logout")
    assert response.status_code == 204
    assert "Max-Age=0" in response.headers["set-cookie"]
    # Replaying the old cookie by hand: the server no longer knows it.
    replay = httpx.get(gateway.url + "/console/api/me", cookies={"console_session": token})
    assert replay.status_code == 401 and error_type(replay) == "unauthenticated"


def test_foreign_origin_is_refused_before_the_session(gateway, owner, project):
    path = f"/console/api/projects/{project['id']}/keys"
    evil = {"origin": "https://evil.example"}
    refused = owner.post(path, {"scopes": ["inference"]}, headers=evil)
    assert refused.status_code == 403 and error_type(refused) == "forbidden"
    # Checked before the session: without a cookie it is still 403, not 401.
    anonymous = httpx.post(gateway.url + path, json={}, headers=evil)
    assert anonymous.status_code == 403
    login = httpx.post(
        gateway.url + "/console/api/login",
        json={"email": "owner@example.com", "password": PASSWORD},
        headers=evil,
    )
    assert login.status_code == 403
    assert owner.get(f"/console/api/projects/{project['id']}/keys").json()["data"] == []
    # Our own origin, and no Origin at all, pass; safe methods are never checked.
    same = owner.post(path, {"scopes": ["inference"]}, headers={"origin": gateway.url})
    assert same.status_code == 201
    assert owner.get("/console/api/projects", headers=evil).status_code == 200


def test_api_keys_are_never_accepted_on_the_console(gateway, owner, project):
    key = owner.post(
        f"/console/api/projects/{project['id']}/keys", {"scopes": ["inference", "receipts"]}
    ).json()["key"]
    for headers in (bearer(key), {"x-api-key": key}):
        response = httpx.get(gateway.url + "/console/api/projects", headers=headers)
        assert response.status_code == 401 and error_type(response) == "unauthenticated"
        played = httpx.post(
            gateway.url + f"/console/api/projects/{project['id']}/playground/chat/completions",
            json=chat_body(),
            headers=headers,
        )
        assert played.status_code == 401 and error_type(played) == "unauthenticated"


def test_session_cookies_are_never_accepted_on_v1(gateway, owner):
    cookie = {"cookie": f"console_session={owner.session}"}
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/v1")]:
        response = httpx.request(
            method,
            gateway.url + path,
            headers=cookie,
            json=chat_body() if method == "POST" else None,
        )
        assert response.status_code == 401, path
        assert error_type(response) == "invalid_api_key"


def test_disabled_user_loses_sessions_and_cannot_sign_in(gateway, member, member_email):
    assert member.get("/console/api/me").status_code == 200
    gateway.cli("users", "disable", member_email)
    assert member.get("/console/api/me").status_code == 401
    assert member.login(member_email).status_code == 401


def test_password_hashes_never_reach_a_response_or_the_log(gateway, owner, member, project):
    gateway.cli("users", "grant", "owner@example.com", "--project", project["id"])
    bodies = [owner.get("/console/api/me").text, member.get("/console/api/me").text]
    bodies.append(str(gateway.cli("users", "list")))
    seen = "\n".join(bodies + owner.seen + member.seen)
    assert "$argon2" not in seen and "password" not in seen.lower()
    assert PASSWORD not in gateway.log()
    assert "$argon2" not in gateway.log()
