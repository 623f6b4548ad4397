"""Console pages over real HTTP: headers, sign-in redirects, visibility, assets; and the
server's start-up path without argon2."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.console.support import ConsoleClient


def _maps(gateway) -> str:
    return Path(f"/proc/{gateway.process.pid}/maps").read_text()


def test_argon2_loads_only_at_the_first_sign_in(tmp_path):
    from tests.console.support import create_user
    from tests.support.gateway_process import GatewayProcess

    with GatewayProcess(tmp_path) as gateway:
        create_user(gateway, "owner@example.com")
        httpx.get(gateway.url + "/console/login")
        assert "_argon2_cffi_bindings" not in _maps(gateway)
        ConsoleClient(gateway).login("owner@example.com")
        assert "_argon2_cffi_bindings" in _maps(gateway)


def test_pages_carry_a_strict_csp_and_need_a_session(gateway, owner, project):
    pid = project["id"]
    paths = ["/console/projects"] + [
        f"/console/projects/{pid}{tab}"
        for tab in ("", "/keys", "/usage", "/receipts", "/ledger", "/sandboxes", "/playground")
    ]
    for path in paths:
        page = owner.get(path)
        assert page.status_code == 200, path
        assert page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert "<script>" not in page.text and " style=" not in page.text
        anonymous = httpx.get(gateway.url + path, follow_redirects=False)
        assert anonymous.status_code == 303 and anonymous.headers["location"] == "/console/login"
    login = httpx.get(gateway.url + "/console/login")
    assert login.status_code == 200
    for label in ("Email", "Password", "Sign in"):
        assert label in login.text
    home = owner.get("/console", follow_redirects=False)
    assert home.status_code == 303 and home.headers["location"] == "/console/projects"


def test_a_member_gets_404_pages_for_projects_not_granted(member, project):
    for tab in ("", "/keys", "/usage", "/playground"):
        page = member.get(f"/console/projects/{project['id']}{tab}")
        assert page.status_code == 404 and "text/html" in page.headers["content-type"]
    assert project["id"] not in member.get("/console/projects").text


def test_static_assets_are_served_same_origin(gateway):
    for name, kind in [
        ("console.js", "text/javascript"),
        ("console.css", "text/css"),
        ("favicon.svg", "image/svg+xml"),
    ]:
        asset = httpx.get(f"{gateway.url}/console/static/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    assert httpx.get(gateway.url + "/console/static/secrets.txt").status_code == 404
    assert httpx.get(gateway.url + "/console/static/..%2Fapp.py").status_code == 404


def test_values_are_escaped(owner):
    created = owner.post("/console/api/projects", {"name": "<img src=x onerror=alert(1)>"})
    page = owner.get(f"/console/projects/{created.json()['id']}")
    assert "<img src=x" not in page.text and "&lt;img src=x" in page.text


def test_a_balance_past_the_largest_single_amount_shows(gateway, owner):
    """An amount is at most 10^12 on the way in; a balance of two such credits is the
    gateway's own figure, read back without that bound."""
    pid = owner.post("/console/api/projects", {"name": "rich"}).json()["id"]
    for _ in range(2):
        gateway.cli("credit", "add", "--project", pid, "1000000000000")
    page = owner.get(f"/console/projects/{pid}")
    assert page.status_code == 200 and "2000000000000" in page.text.replace(",", "")
