"""Hosted agents in a real browser (Debian's chromium through Playwright) against a real
`gateway serve` and the real sandbox node: create an agent, start a run, watch it stream
to its end; cancel another. Checked throughout: no console error, no CSP violation, no
request to another origin, no sideways scrolling; screenshots at 1280x800 and 390x844."""

from __future__ import annotations

import re

import pytest

from tests.console.agents_support import gateway_with_node
from tests.console.test_browser import _open, _sign_in, browser, sync_api  # noqa: F401

# Long enough for the run page to open while the run still goes on.
SLOW_SIX_TIMES_SEVEN = "Compute:\n```python\nimport time\ntime.sleep(3)\nprint(6*7)\n```"
VERY_SLOW = "```python\nimport time\ntime.sleep(20)\n```"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with gateway_with_node(tmp_path_factory.mktemp("agents-browser")) as process:
        yield process


def _create_agent(w, gateway, project_id: str) -> str:
    page = w.page
    page.goto(f"{gateway.url}/console/projects/{project_id}/sandboxes")
    page.get_by_role("button", name="Create sandbox").click()
    sync_api.expect(page.get_by_role("cell", name="python")).to_be_visible()
    page.get_by_role("link", name="Agents").click()
    page.get_by_label("Name").fill("Calculator")
    page.locator("select[name=model]").select_option("echo-1")
    page.get_by_label("Instructions").fill("Run the code you are given.")
    page.get_by_label("Max steps").fill("4")
    assert page.get_by_label("Sandbox tool").is_checked()
    page.locator("select[name=sandbox_id]").select_option(index=0)
    page.get_by_role("button", name="Create agent").click()
    page.wait_for_url(re.compile(r".*/console/agents/agt_[0-9a-f]+$"))
    return page.url.rsplit("/", 1)[1]


def _start_run(w, text: str, budget: str) -> None:
    page = w.page
    page.get_by_label("Input").fill(text)
    page.get_by_label("Budget (USD)").fill(budget)
    with page.expect_response(re.compile(r".*/runs/run_[0-9a-f]+/events$")) as stream:
        page.get_by_role("button", name="Start run").click()
        page.wait_for_url(re.compile(r".*/console/agents/agt_[0-9a-f]+/runs/run_[0-9a-f]+$"))
    assert stream.value.headers["content-type"].startswith("text/event-stream")


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_an_agent_run_streams_to_its_end(browser, gateway, tmp_path, width, height):  # noqa: F811
    expect = sync_api.expect
    w = _open(browser, gateway, tmp_path, width, height)
    page = w.page
    _sign_in(w, gateway)
    project_id = gateway.create_project(f"agents {width}", "--balance", "5")
    agent_id = _create_agent(w, gateway, project_id)
    w.shot("agent")

    _start_run(w, SLOW_SIX_TIMES_SEVEN, "0.50")
    expect(page.locator("#run-status")).to_have_text("running")  # the stream goes on
    expect(page.locator("#run-live")).to_contain_text("Running step")
    w.shot("run-running")
    expect(page.locator("#run-status")).to_have_text("completed", timeout=30_000)
    rows = page.locator("#run-steps tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(1)).to_contain_text("python")
    links = page.locator('#run-steps a[href^="/proofs/rcpt_"]')
    expect(links).to_have_count(3)
    expect(page.locator("#run-output")).to_have_text("42\n")
    expect(page.locator("#run-cancel")).to_have_count(0)
    spent = page.locator("#run-spent").text_content()
    assert re.fullmatch(r"\$0\.0\d{1,5}", spent) and spent.strip("$0.") != "", spent
    expect(page.locator("#run-budget")).to_have_text("$0.50")
    bar = int(page.locator("#run-bar").get_attribute("width"))
    assert 0 < bar < 1000
    w.shot("run-completed")
    # The server renders the same page on a reload, from the records.
    page.reload()
    expect(page.locator("#run-steps tbody tr")).to_have_count(3)
    assert int(page.locator("#run-bar").get_attribute("width")) == bar
    receipt = links.first.get_attribute("href")
    page.goto(gateway.url + receipt)
    expect(page.locator("h1")).to_have_text("Receipt")

    # Another run, cancelled from its page.
    page.goto(f"{gateway.url}/console/agents/{agent_id}")
    _start_run(w, VERY_SLOW, "0.50")
    expect(page.locator("#run-live")).to_contain_text("sandbox python", timeout=20_000)
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-status")).to_have_text("cancelled", timeout=15_000)
    expect(page.locator("#run-error")).to_contain_text("cancelled")
    w.shot("run-cancelled")
    page.goto(f"{gateway.url}/console/agents/{agent_id}")
    expect(page.locator("table").get_by_role("cell", name="cancelled")).to_be_visible()
    w.shot("agent-runs")
    page.goto(f"{gateway.url}/console/projects/{project_id}/agents")
    expect(page.get_by_role("link", name="Calculator")).to_be_visible()
    w.shot("agents-list")
