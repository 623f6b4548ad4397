"""Single sign-on over real HTTP: a real `gateway serve` with [console.oidc] pointing at a
fake identity provider that is a real server too (tests/support/fake_oidc.py). Redirects
are followed by hand, as a browser would: the gateway's client keeps its cookies, the
provider is visited without them. Each refusal is checked in the database: no user, no
session."""

from __future__ import annotations

import sqlite3
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from model_gateway.gateway.console.sso_state import PendingSignIns
from tests.console.support import create_user
from tests.support.fake_oidc import TAMPERINGS, FakeIdentityProvider
from tests.support.gateway_process import GatewayProcess

SECRET_ENV = {"SSO_SECRET": "idp-client-secret-for-tests"}


@pytest.fixture(scope="module")
def idp():
    with FakeIdentityProvider() as provider:
        yield provider


@pytest.fixture(scope="module")
def sso_gateway(tmp_path_factory, idp):
    folder = tmp_path_factory.mktemp("sso")
    with GatewayProcess(folder, extra_config=idp.config(), env=SECRET_ENV) as process:
        create_user(process, "owner@example.com")  # the first user: an owner
        yield process


@pytest.fixture(autouse=True)
def fresh_knobs(idp):
    idp.email, idp.email_verified, idp.tamper, idp.deny = "alice@example.com", True, None, False
    idp.client_secret = SECRET_ENV["SSO_SECRET"]
    yield


def db_rows(gateway: GatewayProcess, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(gateway.folder / "data" / "gateway.db") as db:
        return db.execute(sql, args).fetchall()


def users(gateway: GatewayProcess) -> dict[str, tuple]:
    rows = db_rows(gateway, "SELECT email, role, disabled, id FROM users")
    return {email: (role, disabled, user_id) for email, role, disabled, user_id in rows}


def session_count(gateway: GatewayProcess) -> int:
    return db_rows(gateway, "SELECT count(*) FROM sessions")[0][0]


def to_provider(client: httpx.Client, idp: FakeIdentityProvider) -> str:
    """GET /console/sso/start; the provider's redirect back (the callback URL)."""
    start = client.get("/console/sso/start")
    assert start.status_code == 303, start.text
    location = start.headers["location"]
    assert location.startswith(idp.url + "/authorize?")
    at_provider = httpx.get(location)  # the issuer's site: no gateway cookie goes there
    assert at_provider.status_code == 302, at_provider.text
    return at_provider.headers["location"]


def sso_sign_in(client: httpx.Client, idp: FakeIdentityProvider) -> httpx.Response:
    return client.get(to_provider(client, idp))


def assert_refused(response: httpx.Response, status: int, message: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert message in response.text
    assert 'href="/console/sso/start"' in response.text  # the sign-in page, to try again
    assert "console_session=" not in response.headers.get("set-cookie", "")


def me(client: httpx.Client) -> dict:
    answer = client.get("/console/api/me")
    assert answer.status_code == 200, answer.text
    return answer.json()["user"]


def test_first_sign_in_creates_a_member_with_a_working_session(sso_gateway, idp):
    idp.email = "new.person@Example.com"
    sessions = session_count(sso_gateway)
    with httpx.Client(base_url=sso_gateway.url) as client:
        start = client.get("/console/sso/start")
        # The pending sign-in's cookie: sealed, short-lived, Lax for the issuer's return.
        cookie = start.headers["set-cookie"]
        assert cookie.startswith("console_sso=")
        for attribute in ("HttpOnly", "SameSite=Lax", "Path=/console/sso/callback", "Max-Age=600"):
            assert attribute in cookie
        assert "Secure" not in cookie  # development; production adds it
        query = parse_qs(urlsplit(start.headers["location"]).query)
        assert {
            k: v[0] for k, v in query.items() if k not in ("state", "nonce", "code_challenge")
        } == {
            "response_type": "code",
            "client_id": idp.client_id,
            "redirect_uri": sso_gateway.url + "/console/sso/callback",
            "scope": "openid email profile",
            "code_challenge_method": "S256",
        }
        assert len(query["state"][0]) >= 32 and len(query["nonce"][0]) >= 32
        assert query["state"][0] not in cookie and query["nonce"][0] not in cookie  # sealed
        at_provider = httpx.get(start.headers["location"])
        done = client.get(at_provider.headers["location"])
        assert done.status_code == 200, done.text
        assert 'http-equiv="refresh" content="0; url=/console/projects"' in done.text
        assert client.cookies.get("console_sso") is None  # single use: cleared
        user = me(client)
        assert (user["email"], user["role"]) == ("new.person@Example.com", "member")
        assert client.get("/console/projects").status_code == 200
    role, disabled, user_id = users(sso_gateway)["new.person@Example.com"]
    assert (role, disabled) == ("member", 0)
    # Recorded as made by the person's own sign-in, then their session.
    recorded = sso_gateway.cli("audit", "list", "--limit", "5")["data"]
    mine = [e for e in recorded if e["target"].get("id") == user_id]
    assert [(e["action"], e["actor"]) for e in mine] == [
        ("session.sign_in", "user:new.person@Example.com"),
        ("user.create", "user:new.person@Example.com"),
    ]
    assert mine[1]["changes"] == {"email": "new.person@Example.com", "role": "member"}
    assert session_count(sso_gateway) == sessions + 1
    # The PKCE verifier and the client's secret reached the token endpoint (the fake
    # checks both); the secret went as HTTP basic, as its discovery asks.
    token_request = idp.token_requests[-1]
    assert token_request["grant_type"] == "authorization_code"
    assert len(token_request["code_verifier"]) >= 43
    assert "client_secret" not in token_request


def test_a_second_sign_in_reuses_the_user(sso_gateway, idp):
    idp.email = "bob@example.com"
    with httpx.Client(base_url=sso_gateway.url) as first:
        assert sso_sign_in(first, idp).status_code == 200
        first_id = me(first)["id"]
    count = len(users(sso_gateway))
    with httpx.Client(base_url=sso_gateway.url) as second:
        assert sso_sign_in(second, idp).status_code == 200
        assert me(second)["id"] == first_id
    assert len(users(sso_gateway)) == count


def test_an_existing_owner_keeps_their_role_and_password(sso_gateway, idp):
    idp.email = "OWNER@example.com"  # the same user: emails compare without case
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert sso_sign_in(client, idp).status_code == 200
        assert me(client)["email"] == "owner@example.com" and me(client)["role"] == "owner"
    with httpx.Client(base_url=sso_gateway.url) as client:
        signed = client.post(
            "/console/api/login",
            json={"email": "owner@example.com", "password": "correct horse battery staple"},
        )
        assert signed.status_code == 200  # password sign-in stays


def test_an_sso_user_has_no_usable_password(sso_gateway, idp):
    idp.email = "carol@example.com"
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert sso_sign_in(client, idp).status_code == 200
        for password in ("", "x" * 10, "!", "None"):
            refused = client.post(
                "/console/api/login", json={"email": "carol@example.com", "password": password}
            )
            assert refused.status_code in (400, 401)


def test_a_disabled_user_is_refused(sso_gateway, idp):
    create_user(sso_gateway, "dora@example.com")
    sso_gateway.cli("users", "disable", "dora@example.com")
    idp.email = "dora@example.com"
    sessions = session_count(sso_gateway)
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert_refused(sso_sign_in(client, idp), 403, "This account is disabled.")
        assert client.get("/console/api/me").status_code == 401
    assert session_count(sso_gateway) == sessions
    [failed] = sso_gateway.cli("audit", "list", "--limit", "1")["data"]
    assert (failed["action"], failed["actor"]) == ("session.sign_in_failed", "anonymous")
    assert failed["target"] == {"type": "user", "email": "dora@example.com"}


REFUSALS = {
    "bad-signature": 401,
    "wrong-aud": 401,
    "wrong-iss": 401,
    "expired": 401,
    "future-iat": 401,
    "wrong-nonce": 401,
    "no-nonce": 401,
    "unknown-kid": 401,
    "alg-none": 401,
    "hs256": 401,
}
assert set(REFUSALS) == set(TAMPERINGS)


@pytest.mark.parametrize("tamper", TAMPERINGS)
def test_a_tampered_id_token_is_refused(sso_gateway, idp, tamper):
    idp.email, idp.tamper = f"{tamper}@example.com", tamper
    sessions = session_count(sso_gateway)
    with httpx.Client(base_url=sso_gateway.url) as client:
        response = sso_sign_in(client, idp)
        assert_refused(response, REFUSALS[tamper], "could not be verified")
        assert client.get("/console/api/me").status_code == 401
    assert f"{tamper}@example.com" not in users(sso_gateway)
    assert session_count(sso_gateway) == sessions


@pytest.mark.parametrize(
    ("email", "verified", "message"),
    [
        ("eve@example.org", True, "domain may not sign in"),
        ("eve@sub.example.com", True, "domain may not sign in"),
        ("eve@evil.org@example.com", True, "domain may not sign in"),  # two @: not an address
        ("eve@example.com", False, "has not verified your email"),
    ],
)
def test_an_email_not_verified_or_of_another_domain_is_refused(
    sso_gateway, idp, email, verified, message
):
    idp.email, idp.email_verified = email, verified
    sessions = session_count(sso_gateway)
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert_refused(sso_sign_in(client, idp), 403, message)
    assert email not in users(sso_gateway)
    assert session_count(sso_gateway) == sessions


def test_a_wrong_state_is_refused(sso_gateway, idp):
    idp.email = "frank@example.com"
    sessions, exchanged = session_count(sso_gateway), len(idp.token_requests)
    with httpx.Client(base_url=sso_gateway.url) as client:
        callback = urlsplit(to_provider(client, idp))
        query = parse_qs(callback.query)
        query["state"] = ["A" + query["state"][0][1:]]
        forged = callback._replace(query=urlencode({k: v[0] for k, v in query.items()}))
        assert_refused(client.get(forged.geturl()), 400, "unknown, used or expired")
    assert "frank@example.com" not in users(sso_gateway)
    assert session_count(sso_gateway) == sessions
    assert len(idp.token_requests) == exchanged  # refused before the code was used


def test_a_replayed_state_is_refused(sso_gateway, idp):
    idp.email = "grace@example.com"
    with httpx.Client(base_url=sso_gateway.url) as client:
        callback = to_provider(client, idp)
        sealed = client.cookies.get("console_sso")
        assert client.get(callback).status_code == 200
    sessions, count = session_count(sso_gateway), len(users(sso_gateway))
    # The same callback again, with the pending sign-in's cookie copied before its use,
    # and without it (the browser cleared it).
    for cookies in ({"console_sso": sealed}, {}):
        with httpx.Client(base_url=sso_gateway.url, cookies=cookies) as replay:
            assert_refused(replay.get(callback), 400, "unknown, used or expired")
    assert session_count(sso_gateway) == sessions and len(users(sso_gateway)) == count


def test_a_callback_in_another_browser_or_with_a_forged_cookie_is_refused(sso_gateway, idp):
    idp.email = "heidi@example.com"
    with httpx.Client(base_url=sso_gateway.url) as client:
        callback = to_provider(client, idp)
        sealed = client.cookies.get("console_sso")
    forged = sealed[:-2] + ("AA" if not sealed.endswith("AA") else "BB")
    for cookies in ({}, {"console_sso": forged}, {"console_sso": "not-base64!"}):
        with httpx.Client(base_url=sso_gateway.url, cookies=cookies) as other:
            assert_refused(other.get(callback), 400, "unknown, used or expired")
    assert "heidi@example.com" not in users(sso_gateway)


def test_a_declined_consent_and_a_refused_code_are_refused(sso_gateway, idp):
    idp.email, idp.deny = "ivan@example.com", True
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert_refused(sso_sign_in(client, idp), 403, "did not sign you in")
    idp.deny = False
    idp.client_secret = "the provider's secret changed"  # the gateway's no longer fits
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert_refused(sso_sign_in(client, idp), 401, "did not confirm the sign-in")
    assert "ivan@example.com" not in users(sso_gateway)


def test_rotated_keys_are_fetched_again_once(sso_gateway, idp):
    idp.email = "judy@example.com"
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert sso_sign_in(client, idp).status_code == 200  # the keys are cached now
    fetched = idp.jwks_fetches
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert sso_sign_in(client, idp).status_code == 200
    assert idp.jwks_fetches == fetched  # cached
    idp.rotate()
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert sso_sign_in(client, idp).status_code == 200
    assert idp.jwks_fetches == fetched + 1
    idp.tamper = "unknown-kid"  # refetched once more, then refused
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert_refused(sso_sign_in(client, idp), 401, "could not be verified")
    assert idp.jwks_fetches == fetched + 2


def test_no_code_token_or_secret_is_logged(sso_gateway, idp):
    idp.email = "ken@example.com"
    with httpx.Client(base_url=sso_gateway.url) as client:
        assert sso_sign_in(client, idp).status_code == 200
    log = sso_gateway.log()
    assert "/console/sso/callback" in log  # the access line is there, without its query
    assert idp.issued and not [value for value in idp.issued if value in log]
    assert SECRET_ENV["SSO_SECRET"] not in log


def test_without_oidc_there_is_no_sso(gateway):
    page = httpx.get(gateway.url + "/console/login")
    assert page.status_code == 200 and "Sign in with SSO" not in page.text
    assert 'method="post"' in page.text
    for path in ("/console/sso/start", "/console/sso/callback?code=x&state=y"):
        assert httpx.get(gateway.url + path).status_code == 404


def test_the_sign_in_page_links_to_sso(sso_gateway):
    page = httpx.get(sso_gateway.url + "/console/login")
    assert '<a href="/console/sso/start">Sign in with SSO</a>' in page.text
    assert 'method="post"' in page.text
    assert "form-action 'self'" in page.headers["content-security-policy"]


def test_public_url_names_the_redirect_uri(tmp_path, idp):
    server_extra = 'public_url = "https://gw.example.com/llm"'
    with GatewayProcess(
        tmp_path, extra_config=idp.config(), env=SECRET_ENV, server_extra=server_extra
    ) as gateway:
        start = httpx.get(gateway.url + "/console/sso/start")
    query = parse_qs(urlsplit(start.headers["location"]).query)
    assert query["redirect_uri"] == ["https://gw.example.com/llm/console/sso/callback"]


def test_client_secret_post_and_es256(tmp_path):
    with FakeIdentityProvider(auth_method="client_secret_post", algorithm="ES256") as idp:
        env = {"SSO_SECRET": idp.client_secret}
        with GatewayProcess(tmp_path, extra_config=idp.config(domains=[]), env=env) as gateway:
            idp.email = "someone@anywhere.test"  # no domain list: any verified email
            with httpx.Client(base_url=gateway.url) as client:
                assert sso_sign_in(client, idp).status_code == 200
                assert me(client)["email"] == "someone@anywhere.test"
        assert idp.token_requests[-1]["client_secret"] == idp.client_secret


def test_an_unreachable_provider_answers_503_on_the_sign_in_page(tmp_path):
    with FakeIdentityProvider() as gone:
        config = gone.config()
    with GatewayProcess(tmp_path, extra_config=config, env=SECRET_ENV) as gateway:
        page = httpx.get(gateway.url + "/console/sso/start")
    assert_refused(page, 503, "cannot be reached")
    assert "console_sso=" not in page.headers.get("set-cookie", "")


def test_the_pending_cookie_is_secure_in_production():
    pending = PendingSignIns(b"p" * 32, secure=True)
    _, cookie = pending.begin("https://gw.example.com/console/sso/callback")
    assert cookie.endswith("; Secure; Max-Age=600")
    assert pending.cleared() == (
        "console_sso=; HttpOnly; SameSite=Lax; Path=/console/sso/callback; Secure; Max-Age=0"
    )
