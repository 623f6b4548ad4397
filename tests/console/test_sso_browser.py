"""Single sign-on in a real browser (Debian's chromium through Playwright) at 1280x800 and
390x844: "Sign in with SSO" on the sign-in page, the fake identity provider's consent,
and the console, signed in. The provider is at `localhost`, the gateway at `127.0.0.1`:
another site, as a real issuer is; the way back starts on the provider's page (a link
there), so that the cookies' SameSite rules are exercised as with a real provider.
Checked throughout: no console error, no CSP violation, no request to another origin but
the top-level navigation to the issuer's authorization endpoint."""

from __future__ import annotations

import pytest

from tests.console.support import create_user
from tests.console.test_browser import Watched, browser, sync_api  # noqa: F401
from tests.support.fake_oidc import FakeIdentityProvider
from tests.support.gateway_process import GatewayProcess


class IssuerAllowed(Watched):
    """Watched, but the main frame's navigations to the issuer's /authorize are allowed."""

    def __init__(self, page, origin: str, shots, issuer: str) -> None:
        self.issuer = issuer
        self.to_issuer: list[str] = []
        super().__init__(page, origin, shots)

    def _request(self, request) -> None:
        top_level = request.is_navigation_request() and request.frame == self.page.main_frame
        if top_level and request.url.startswith(self.issuer + "/authorize?"):
            self.to_issuer.append(request.url)
            return
        super()._request(request)


@pytest.fixture(scope="module")
def idp():
    with FakeIdentityProvider(host="localhost", consent_page=True) as provider:
        yield provider


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, idp):
    env = {"SSO_SECRET": idp.client_secret}
    folder = tmp_path_factory.mktemp("sso-browser")
    with GatewayProcess(folder, extra_config=idp.config(), env=env) as process:
        create_user(process, "owner@example.com")
        yield process


def _open(browser, gateway, idp, tmp_path, width: int, height: int) -> IssuerAllowed:  # noqa: F811
    context = browser.new_context(viewport={"width": width, "height": height})
    return IssuerAllowed(context.new_page(), gateway.url, tmp_path, idp.url)


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_sign_in_with_sso(browser, gateway, idp, tmp_path, width, height):  # noqa: F811
    expect = sync_api.expect
    idp.email, idp.tamper = "pat@example.com", None  # the first width creates, the second reuses
    w = _open(browser, gateway, idp, tmp_path, width, height)
    page = w.page
    page.goto(gateway.url + "/console")
    page.wait_for_url("**/console/login")
    link = page.get_by_role("link", name="Sign in with SSO")
    expect(link).to_be_visible()
    expect(page.locator("form#login")).to_have_attribute("method", "post")
    w.shot("sso-signin")

    link.click()
    # On the provider's site, the person consents; its page's link leads back.
    page.get_by_role("link", name="Continue as pat@example.com").click()
    page.wait_for_url("**/console/projects")
    expect(page.get_by_role("heading", name="Projects")).to_be_visible()
    expect(page.locator(".who")).to_have_text("pat@example.com · member")
    assert len(w.to_issuer) == 1 and "code_challenge_method=S256" in w.to_issuer[0]
    w.shot("sso-signed-in")
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert "console_sso" not in cookies  # single use: cleared by the callback
    assert cookies["console_session"]["sameSite"] == "Strict"

    # Sign out, then a refused sign-in: back on the sign-in page with the error.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/console/login")
    idp.tamper = "bad-signature"
    page.get_by_role("link", name="Sign in with SSO").click()
    page.get_by_role("link", name="Continue as pat@example.com").click()
    expect(page.get_by_role("alert")).to_contain_text("could not be verified")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    # The browser reports the refused callback's 401 as a failed resource: that one only.
    assert all("401" in error for error in w.errors)
    w.errors.clear()
    w.shot("sso-refused")
    assert page.goto(gateway.url + "/console/api/me").status == 401
    page.context.close()
