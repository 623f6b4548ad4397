"""The console's wave-3 pages in a real browser (Debian's chromium through Playwright)
against a real `gateway serve`, at 1280x800 and 390x844: the key form's limits and a key's
page, the overview's trend and month against budget, receipts filtered through the URL
(back and forward work; without JavaScript too), the multi-turn playground, amounts with
their currency, and a phone layout where every tab stays in view and chart labels are at
least 11 px. Every page is checked for console errors, CSP violations, requests to another
origin and sideways scrolling. Screenshots go to each test's folder; the ones kept in
tests/console/screenshots/wave3/ are made with
`GATEWAY_SCREENSHOTS=tests/console/screenshots/wave3 pytest <this file>`."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.console.support import PASSWORD, create_user
from tests.console.test_browser import Watched, _sign_in, browser, sync_api  # noqa: F401
from tests.support.gateway_process import GatewayProcess
from tests.support.http import bearer, chat_body

SIZES = [(1280, 800), (390, 844)]
TABS = ("", "/keys", "/usage", "/receipts", "/ledger", "/sandboxes", "/playground", "/agents")

# Each chart label's size on screen: its font size in SVG units times the drawn scale.
LABEL_PX = """() => Array.from(document.querySelectorAll("svg.chart text"), (text) => {
  const svg = text.ownerSVGElement;
  const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  return parseFloat(getComputedStyle(text).fontSize) * scale;
})"""
# Where the current tab is drawn, and whether the tab bar hides any of its tabs.
ACTIVE_TAB = """() => {
  const nav = document.querySelector("nav.tabs");
  const tab = nav.querySelector("[aria-current=page]").getBoundingClientRect();
  return {left: tab.left, right: tab.right, top: tab.top, bottom: tab.bottom,
          width: window.innerWidth, hidden: nav.scrollWidth - nav.clientWidth};
}"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with GatewayProcess(tmp_path_factory.mktemp("wave3-browser")) as process:
        create_user(process, "owner@example.com")
        yield process


def _open(browser, gateway, shots: Path, width: int, height: int, **options) -> Watched:  # noqa: F811
    context = browser.new_context(viewport={"width": width, "height": height}, **options)
    return Watched(context.new_page(), gateway.url, shots)


def _tabs_and_labels_read_well(w: Watched, where: str) -> None:
    tab = w.page.evaluate(ACTIVE_TAB)
    assert tab["hidden"] <= 0, f"{where}: the tab bar hides {tab['hidden']} px of tabs"
    assert 0 <= tab["left"] and tab["right"] <= tab["width"], f"{where}: active tab {tab}"
    sizes = w.page.evaluate(LABEL_PX)
    assert all(size >= 11 for size in sizes), f"{where}: chart labels of {sizes} px"


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_keys_with_limits_and_a_keys_page(browser, gateway, tmp_path, width, height):  # noqa: F811
    expect = sync_api.expect
    w = _open(browser, gateway, tmp_path, width, height)
    page = w.page
    _sign_in(w, gateway)
    project_id = gateway.create_project(f"keys {width}", "--balance", "5")
    page.goto(f"{gateway.url}/console/projects/{project_id}/keys")
    page.get_by_label("Name", exact=True).fill("limited key")
    page.get_by_label("Monthly limit", exact=True).fill("1.5")
    page.get_by_label("RPM", exact=True).fill("60")
    page.get_by_label("TPM", exact=True).fill("9000")
    page.get_by_label("Models", exact=True).fill("echo-1, org/echo-2")
    page.get_by_label("Expires at", exact=True).fill("2031-06-01T12:30")
    w.shot("wave3-key-form")
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#reveal-value")
    expect(secret).to_have_text(re.compile(r"^proj_live_"))
    key = secret.text_content()
    for model in ("echo-1", "org/echo-2", "echo-1"):
        answer = httpx.post(
            gateway.url + "/v1/chat/completions", json=chat_body(model), headers=bearer(key)
        )
        assert answer.status_code == 200, answer.text
    page.reload()
    row = page.locator("tbody tr").first
    expect(row.locator('td[data-label="RPM"]')).to_have_text("60")
    expect(row.locator('td[data-label="TPM"]')).to_have_text("9000")
    expect(row.locator('td[data-label="Monthly limit"]')).to_have_text("$1.50")
    expect(row.locator('td[data-label="Expires (UTC)"]')).to_have_text("2031-06-01 12:30")
    _tabs_and_labels_read_well(w, "keys")
    w.shot("wave3-keys")

    row.get_by_role("link", name=key[:18]).click()
    page.wait_for_url(f"**/console/keys/{key[:18]}")
    expect(page.locator(".month-text")).to_contain_text("of its $1.50 monthly limit")
    facts = page.locator(".facts")
    expect(facts).to_contain_text("echo-1, org/echo-2")
    expect(facts).to_contain_text("2031-06-01 12:30")
    expect(page.locator('a[href^="/proofs/rcpt_"]')).to_have_count(3)
    expect(page.locator('td[data-label="Cost"]').first).to_have_text(re.compile(r"^\$0\.\d+$"))
    _tabs_and_labels_read_well(w, "key page")
    w.shot("wave3-key")
    # Its limits change on its page; an emptied field clears its limit.
    expect(page.get_by_label("RPM", exact=True)).to_have_value("60")
    page.get_by_label("RPM", exact=True).fill("90")
    page.get_by_label("TPM", exact=True).fill("")
    page.get_by_role("button", name="Save").click()
    expect(facts).to_contain_text("90")
    expect(page.locator(".facts div", has_text="TPM")).to_contain_text("the project's")
    shown = gateway.cli("keys", "list", "--project", project_id)["data"][0]
    assert (shown["rpm"], shown["tpm"], shown["monthly_limit"]) == (90, None, "1.500000")
    w.clean("key changed")
    page.get_by_role("link", name="All receipts of this key").click()
    page.wait_for_url(re.compile(r".*/receipts\?key=proj_live_"))
    expect(page.locator('a[href^="/proofs/rcpt_"]')).to_have_count(3)
    w.clean("key receipts")


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_overview_trend_usage_and_tabs(browser, gateway, tmp_path, width, height):  # noqa: F811
    expect = sync_api.expect
    w = _open(browser, gateway, tmp_path, width, height)
    page = w.page
    _sign_in(w, gateway)
    project_id = gateway.create_project(f"trend {width}", "--balance", "5", "--budget", "2")
    key = gateway.create_key(project_id)
    for _ in range(3):
        httpx.post(gateway.url + "/v1/chat/completions", json=chat_body(), headers=bearer(key))
    page.goto(f"{gateway.url}/console/projects/{project_id}")
    expect(page.locator(".month-text")).to_contain_text("of the $2.00 monthly budget spent")
    expect(page.locator("svg.meter")).to_be_visible()
    charts = page.locator("svg.chart.small")
    expect(charts).to_have_count(2)
    expect(charts.first.locator("rect.bar").last).to_have_attribute("data-value", "3")
    expect(page.locator(".trend .note")).to_contain_text("3 requests, $0.")
    _tabs_and_labels_read_well(w, "overview")
    w.shot("wave3-overview")
    for tab in TABS:
        page.goto(f"{gateway.url}/console/projects/{project_id}{tab}")
        _tabs_and_labels_read_well(w, tab or "overview")
        w.clean(tab)
    page.goto(f"{gateway.url}/console/projects/{project_id}/usage")
    expect(page.locator("svg.chart rect.bar")).not_to_have_count(0)
    _tabs_and_labels_read_well(w, "usage")
    w.shot("wave3-usage")
    page.goto(f"{gateway.url}/console/projects/{project_id}/ledger")
    expect(page.get_by_role("cell", name="+$5.00")).to_be_visible()
    w.shot("wave3-ledger")


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_receipts_filters_travel_in_the_url(browser, gateway, tmp_path, width, height):  # noqa: F811
    expect = sync_api.expect
    w = _open(browser, gateway, tmp_path, width, height)
    page = w.page
    _sign_in(w, gateway)
    project_id = gateway.create_project(f"receipts {width}", "--balance", "5")
    key = gateway.create_key(project_id)
    for model in ("echo-1", "org/echo-2", "echo-1"):
        httpx.post(gateway.url + "/v1/chat/completions", json=chat_body(model), headers=bearer(key))
    base = f"{gateway.url}/console/projects/{project_id}/receipts"
    page.goto(base)
    rows = page.locator('a[href^="/proofs/rcpt_"]')
    expect(rows).to_have_count(3)
    page.get_by_label("Model", exact=True).fill("echo-1")
    page.get_by_label("Status", exact=True).select_option("succeeded")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r".*/receipts\?model=echo-1&status=succeeded$"))
    expect(rows).to_have_count(2)
    expect(page.get_by_label("Model", exact=True)).to_have_value("echo-1")
    _tabs_and_labels_read_well(w, "receipts")
    if width > 600:  # a wide window shows every column (a phone shows each receipt as a card)
        hidden = page.locator(".scroll").first.evaluate("e => e.scrollWidth - e.clientWidth")
        assert hidden <= 0, f"the receipts table hides {hidden} px of its columns"
    w.shot("wave3-receipts-filtered")
    page.get_by_label("Key", exact=True).select_option(index=1)
    page.get_by_label("Model", exact=True).fill("org/echo-2")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r".*key=proj_live_.*"))
    expect(rows).to_have_count(1)
    page.go_back()
    page.wait_for_url(re.compile(r".*/receipts\?model=echo-1&status=succeeded$"))
    expect(rows).to_have_count(2)
    page.go_forward()
    expect(rows).to_have_count(1)
    page.get_by_role("link", name="Clear filters").click()
    page.wait_for_url(base)
    expect(rows).to_have_count(3)
    w.shot("wave3-receipts")
    # A shared link opens the same list; a bad value is a 400 page, not a 500.
    page.goto(base + "?model=org/echo-2")
    expect(rows).to_have_count(1)
    w.clean("shared link")
    bad = page.goto(base + "?status=sometimes")
    assert bad is not None and bad.status == 400
    expect(page.locator("h1")).to_have_text("400")
    w.errors.clear()  # the browser logs the 400 document as a failed resource


def test_receipts_filters_and_sign_in_work_without_javascript(browser, gateway, tmp_path):  # noqa: F811
    expect = sync_api.expect
    w = _open(browser, gateway, tmp_path, 390, 844, java_script_enabled=False)
    page = w.page
    page.goto(gateway.url + "/console/login")
    assert page.locator("form#login").get_attribute("method") == "post"
    page.get_by_label("Email").fill("owner@example.com")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/console/projects")
    project_id = gateway.create_project("no script", "--balance", "5")
    key = gateway.create_key(project_id)
    for model in ("echo-1", "org/echo-2"):
        httpx.post(gateway.url + "/v1/chat/completions", json=chat_body(model), headers=bearer(key))
    page.goto(f"{gateway.url}/console/projects/{project_id}/receipts")
    page.get_by_label("Model", exact=True).fill("org/echo-2")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r".*/receipts\?model=org%2Fecho-2&key=&status=&from=&to=$"))
    expect(page.locator('a[href^="/proofs/rcpt_"]')).to_have_count(1)
    w.clean("without javascript")


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_the_playground_keeps_the_conversation(browser, gateway, tmp_path, width, height):  # noqa: F811
    expect = sync_api.expect
    w = _open(browser, gateway, tmp_path, width, height)
    page = w.page
    _sign_in(w, gateway)
    project_id = gateway.create_project(f"playground {width}", "--balance", "5")
    page.goto(f"{gateway.url}/console/projects/{project_id}/playground")
    page.get_by_label("Model", exact=True).select_option("echo-1")
    page.get_by_label("System", exact=True).fill("Answer briefly.")
    page.get_by_label("Max tokens", exact=True).fill("64")
    page.get_by_label("Temperature", exact=True).fill("0.2")
    page.get_by_label("Message").fill("first question")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#output")).to_have_text("first question")
    expect(page.locator("#receipt .receipt-facts")).to_contain_text("cost $0.")
    page.get_by_label("Message").fill("second question")
    with page.expect_request(re.compile(r".*/playground/chat/completions$")) as sent:
        page.get_by_role("button", name="Send").click()
    body = sent.value.post_data_json
    assert body["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first question"},
        {"role": "user", "content": "second question"},
    ]
    assert body["max_tokens"] == 64 and body["temperature"] == 0.2 and body["stream"] is True
    expect(page.locator("#output")).to_have_text("second question")
    expect(page.locator("#conversation li.msg")).to_have_count(4)
    expect(page.locator("#conversation .turn-receipt a")).to_have_count(2)
    _tabs_and_labels_read_well(w, "playground")
    w.shot("wave3-playground")
    page.get_by_role("button", name="Clear conversation").click()
    expect(page.locator("#conversation li.msg")).to_have_count(0)
    page.get_by_label("Message").fill("after clearing")
    with page.expect_request(re.compile(r".*/playground/chat/completions$")) as again:
        page.get_by_role("button", name="Send").click()
    assert [m["role"] for m in again.value.post_data_json["messages"]] == ["system", "user"]
    expect(page.locator("#output")).to_have_text("after clearing")
    w.clean("playground")


def test_a_refused_turn_is_left_out_of_the_conversation(browser, gateway, tmp_path):  # noqa: F811
    expect = sync_api.expect
    w = _open(browser, gateway, tmp_path, 390, 844)
    page = w.page
    _sign_in(w, gateway)
    project_id = gateway.create_project("no money")  # no balance: every call is a 402
    page.goto(f"{gateway.url}/console/projects/{project_id}/playground")
    page.get_by_label("Message").fill("will be refused")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#playground .form-error")).to_contain_text("balance")
    expect(page.locator("#conversation li.msg")).to_have_count(0)
    expect(page.locator("#conversation-empty")).to_be_visible()
    expect(page.locator("#receipt")).to_have_text("No receipt: nothing was billed.")
    assert all("402" in error for error in w.errors)  # the refused call's resource error
    w.errors.clear()
    w.clean("refused turn")
