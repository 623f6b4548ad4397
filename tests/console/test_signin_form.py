"""The sign-in form works without JavaScript and never puts the password in a URL: it
posts (`method="post"`) to POST /console/login, which signs in as the JSON endpoint does
(same throttle), then 303 to the console with the session cookie; refused, the sign-in
page again with the error. The JSON POST /console/api/login stays as it was."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.console.support import PASSWORD, create_user
from tests.console.test_throttle_and_production import SMALL, _gateway_with_users
from tests.support.gateway_process import GatewayProcess


def _form(html: str) -> str:
    [form] = re.findall(r'<form[^>]*id="login"[^>]*>', html)
    return form


def _post(gw: GatewayProcess, email: str, password: str, **kwargs) -> httpx.Response:
    return httpx.post(
        gw.url + "/console/login", data={"email": email, "password": password}, **kwargs
    )


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with GatewayProcess(tmp_path_factory.mktemp("signin-form")) as process:
        create_user(process, "form@example.com")
        yield process


def test_the_sign_in_form_posts_to_its_own_page(gw):
    page = httpx.get(gw.url + "/console/login")
    form = _form(page.text)
    assert 'method="post"' in form and 'action="/console/login"' in form
    assert "form-action 'self'" in page.headers["content-security-policy"]


def test_a_form_sign_in_without_javascript_gets_a_session(gw):
    signed = _post(gw, "form@example.com", PASSWORD)
    assert signed.status_code == 303 and signed.headers["location"] == "/console/projects"
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith("console_session=") and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie and "Path=/console" in cookie
    with httpx.Client(base_url=gw.url, cookies=signed.cookies) as browser:
        projects = browser.get("/console/projects")
        assert projects.status_code == 200 and "form@example.com" in projects.text
    assert PASSWORD not in str(signed.headers) and "password" not in signed.headers["location"]


@pytest.mark.parametrize(
    ("email", "password", "status"),
    [
        ("form@example.com", "not the password", 401),
        ("nobody@example.com", PASSWORD, 401),
        ("form@example.com", "", 400),
        ("", PASSWORD, 400),
    ],
)
def test_a_refused_form_sign_in_shows_the_page_again_with_the_error(gw, email, password, status):
    refused = _post(gw, email, password)
    assert refused.status_code == status and "set-cookie" not in refused.headers
    assert refused.headers["content-type"].startswith("text/html")
    assert 'role="alert">' in refused.text and 'role="alert" hidden' not in refused.text
    assert _form(refused.text)  # the form again, the email kept, never the password
    if status == 401:
        assert "The email or password is incorrect." in refused.text
    assert f'value="{email}"' in refused.text
    assert not password or password not in refused.text


def test_a_form_of_another_site_is_refused(gw):
    foreign = _post(gw, "form@example.com", PASSWORD, headers={"origin": "https://evil.example"})
    assert foreign.status_code == 403 and "set-cookie" not in foreign.headers


def test_the_json_sign_in_is_unchanged(gw):
    signed = httpx.post(
        gw.url + "/console/api/login", json={"email": "form@example.com", "password": PASSWORD}
    )
    assert signed.status_code == 200 and signed.json()["user"]["email"] == "form@example.com"
    assert signed.headers["set-cookie"].startswith("console_session=")
    form_encoded = httpx.post(
        gw.url + "/console/api/login", data={"email": "form@example.com", "password": PASSWORD}
    )
    assert form_encoded.status_code == 400  # JSON only, as before


def test_form_and_json_failures_share_the_throttle(tmp_path):
    for gateway in _gateway_with_users(
        tmp_path, SMALL.replace("login_window_s = 3", "login_window_s = 120")
    ):
        for _ in range(2):
            assert _post(gateway, "a@example.com", "wrong password!").status_code == 401
        json_guess = {"email": "a@example.com", "password": "wrong password!"}
        assert httpx.post(gateway.url + "/console/api/login", json=json_guess).status_code == 401
        blocked = _post(gateway, "a@example.com", PASSWORD)  # even the right password waits
        assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) >= 1
        assert "Too many failed sign-ins" in blocked.text and "set-cookie" not in blocked.headers
        blocked_json = httpx.post(
            gateway.url + "/console/api/login",
            json={"email": "a@example.com", "password": PASSWORD},
        )
        assert blocked_json.status_code == 429
