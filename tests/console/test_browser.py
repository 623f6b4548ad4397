"""The console in a real browser: Playwright drives Debian's chromium against a real
`gateway serve`. Every page is checked for console errors, CSP violations and requests to
any other origin; screenshots of each page go to the test's folder (and, when
$GATEWAY_SCREENSHOTS names a folder, are copied there for people to look at)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.console.support import PASSWORD, create_user
from tests.support.gateway_process import GatewayProcess
from tests.support.http import bearer, chat_body

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS_COPY = os.environ.get("GATEWAY_SCREENSHOTS")

if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is missing: scripts/system-deps.sh installs it", pytrace=False)
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)

if os.environ.get("CI") == "true":
    from playwright import sync_api  # in CI a missing package fails the run
else:
    sync_api = pytest.importorskip("playwright.sync_api")

WATCH_CSP = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " " + e.blockedURI);
});
"""


class Watched:
    """A page whose console errors, CSP violations and foreign requests are recorded."""

    def __init__(self, page, origin: str, shots: Path) -> None:
        self.page = page
        self.origin = origin
        self.shots = shots
        self.errors: list[str] = []
        self.foreign: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", self._request)
        page.on("dialog", lambda dialog: dialog.accept())
        page.add_init_script(WATCH_CSP)

    def _request(self, request) -> None:
        parts = urlsplit(request.url)
        if parts.scheme in ("data", "blob", "about"):
            return
        if f"{parts.scheme}://{parts.netloc}" != self.origin:
            self.foreign.append(request.url)

    def clean(self, where: str) -> None:
        """No console error, CSP violation or foreign request so far."""
        violations = self.page.evaluate("window.__csp || []")
        assert violations == [], f"{where}: CSP violations {violations}"
        assert self.errors == [], f"{where}: console errors {self.errors}"
        assert self.foreign == [], f"{where}: requests to other origins {self.foreign}"

    def shot(self, name: str) -> None:
        width = self.page.viewport_size["width"]
        path = self.shots / f"{name}-{width}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if SHOTS_COPY:
            Path(SHOTS_COPY).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(SHOTS_COPY) / path.name)
        self.clean(name)
        overflow = self.page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{name} at {width} px scrolls sideways by {overflow} px"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with GatewayProcess(tmp_path_factory.mktemp("browser")) as process:
        create_user(process, "owner@example.com")
        yield process


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


def _open(browser, gateway, tmp_path, width: int, height: int) -> Watched:
    context = browser.new_context(viewport={"width": width, "height": height})
    return Watched(context.new_page(), gateway.url, tmp_path)


def _sign_in(watched: Watched, gateway) -> None:
    page = watched.page
    page.goto(gateway.url + "/console")
    page.wait_for_url("**/console/login")
    page.get_by_label("Email").fill("owner@example.com")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/console/projects")


def test_operator_journey(browser, gateway, tmp_path):
    w = _open(browser, gateway, tmp_path, 1280, 800)
    page = w.page
    expect = sync_api.expect

    # Sign-in: wrong, then right.
    page.goto(gateway.url + "/console")
    page.wait_for_url("**/console/login")
    w.shot("login")
    page.get_by_label("Email").fill("owner@example.com")
    page.get_by_label("Password").fill("not the right password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("email or password is incorrect")
    # The browser logs the refused sign-in's 401 as a failed resource: that one is expected.
    assert all("401" in error for error in w.errors)
    w.errors.clear()
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/console/projects")
    expect(page.get_by_role("heading", name="Projects")).to_be_visible()

    # A project, funded by a recorded payment.
    page.get_by_label("Name").fill("Browser project")
    page.get_by_label("Monthly budget (USD)").fill("50")
    page.get_by_role("button", name="Create project").click()
    page.wait_for_url(re.compile(r".*/console/projects/prj_[0-9a-f]+$"))
    project_id = page.url.rsplit("/", 1)[1]
    page.get_by_label("Amount (USD)").fill("5")
    page.get_by_label("Reference (invoice, transfer)").fill("INV-BROWSER-1")
    page.get_by_role("button", name="Record payment").click()
    expect(page.locator(".facts").first).to_contain_text("$5.00")
    # Limits: the form sends only what it shows; empty fields clear their limit.
    page.get_by_label("Requests per minute (empty: default)").fill("30")
    page.get_by_label("Monthly budget (USD, empty: none)").fill("")
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".facts").first).to_contain_text("30")
    shown = gateway.cli("projects", "show", page.url.rsplit("/", 1)[1])
    assert shown["rpm"] == 30 and shown["monthly_budget"] is None
    assert shown["allow_models"] is None and shown["exclude_models"] == []
    w.shot("project")

    # A key: shown once, with a copy button; gone after a reload.
    page.get_by_role("link", name="Keys").click()
    page.get_by_label("Name").fill("browser key")
    expect(page.get_by_text("No key yet.")).to_be_visible()
    page.get_by_label("receipts").check()
    page.get_by_label("agents").check()
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#reveal-value")
    expect(secret).to_have_text(re.compile(r"^proj_live_[A-Za-z0-9]{32}$"))
    expect(page.get_by_text("No key yet.")).to_be_hidden()  # the panel shows one now
    key = secret.text_content()
    page.get_by_role("button", name="Copy").click()
    expect(page.locator(".copied")).to_be_visible()
    w.shot("key-created")
    page.reload()
    assert key not in page.content()
    expect(page.get_by_role("cell", name=key[:18])).to_be_visible()
    expect(page.get_by_role("cell", name="agents, inference, receipts")).to_be_visible()
    used = httpx.post(gateway.url + "/v1/chat/completions", json=chat_body(), headers=bearer(key))
    assert used.status_code == 200

    # Revoke, with confirmation: the key then gets 401 on /v1.
    page.get_by_role("button", name="Revoke").click()
    expect(page.get_by_role("cell", name="revoked")).to_be_visible()
    w.shot("keys")
    refused = httpx.post(
        gateway.url + "/v1/chat/completions", json=chat_body(), headers=bearer(key)
    )
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "invalid_api_key"

    # A streamed playground call and its receipt.
    page.get_by_role("link", name="Playground").click()
    page.get_by_label("Model").select_option("echo-1")
    page.get_by_label("Message").fill("streaming through the console playground")
    with page.expect_response(re.compile(r".*/playground/chat/completions$")) as answer:
        page.get_by_role("button", name="Send").click()
    assert answer.value.headers["content-type"].startswith("text/event-stream")
    expect(page.locator("#output")).to_have_text("streaming through the console playground")
    expect(page.locator("#receipt .receipt-id")).to_have_text(re.compile(r"^rcpt_"))
    expect(page.locator("#receipt .receipt-facts")).to_contain_text("cost")
    receipt_id = page.locator("#receipt .receipt-id").text_content()
    w.shot("playground")

    # Usage: the chart of cost per day and the table per model.
    page.get_by_role("link", name="Usage").click()
    expect(page.locator("svg.chart rect.bar")).not_to_have_count(0)
    expect(page.get_by_role("cell", name="echo-1")).to_be_visible()
    expect(page.get_by_role("cell", name="console playground")).to_be_visible()
    w.shot("usage")

    # Receipts link to their public proof; the ledger shows the payment and the charges.
    page.get_by_role("link", name="Receipts").click()
    expect(page.locator(f'a[href="/proofs/{receipt_id}"]')).to_be_visible()
    w.shot("receipts")
    page.get_by_role("link", name="Ledger").click()
    expect(page.get_by_role("cell", name="payment")).to_be_visible()
    expect(page.get_by_role("cell", name="INV-BROWSER-1")).to_be_visible()
    w.shot("ledger")
    page.get_by_role("link", name="Sandboxes").click()
    page.get_by_role("button", name="Create sandbox").click()
    expect(page.get_by_role("cell", name="python")).to_be_visible()
    w.shot("sandboxes")
    page.goto(f"{gateway.url}/console/projects/{project_id}/agents")
    w.shot("agents")

    # Sign out: the pages send us back to sign-in.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/console/login")
    page.goto(gateway.url + "/console/projects")
    page.wait_for_url("**/console/login")
    w.clean("after sign-out")


def test_pages_read_well_on_a_phone(browser, gateway, tmp_path):
    w = _open(browser, gateway, tmp_path, 390, 844)
    page = w.page
    page.goto(gateway.url + "/console/login")
    w.shot("login")
    _sign_in(w, gateway)
    project_id = gateway.create_project("phone", "--balance", "1")
    gateway.create_key(project_id, "inference")
    page.goto(gateway.url + "/console/projects")
    w.shot("projects")
    for tab in ("", "/keys", "/usage", "/receipts", "/ledger", "/playground"):
        page.goto(f"{gateway.url}/console/projects/{project_id}{tab}")
        w.shot("phone-" + (tab.strip("/") or "project"))
