"""A run's transcript in a real browser (Debian's chromium through Playwright) against a
real `gateway serve` and the real sandbox node, at 1280x800 and 390x844: the steps drawn
live as they close, then the same page as the server renders it on a reload: the input
sent to the model, its run_code call, the code, stdout, stderr and "Exit code 3", each
step's receipt link; the program's HTML shown as text, long lines wrapping or scrolling
inside their block. Checked throughout: no console error, no CSP violation, no request
to another origin, no sideways scrolling. Screenshots go to the test's folder; the kept
ones (tests/console/screenshots/wave3/run-transcript-*.png) are made with
`GATEWAY_SCREENSHOTS=tests/console/screenshots/wave3 pytest <this file>`."""

from __future__ import annotations

import re

import pytest

from tests.console.agents_support import gateway_with_node
from tests.console.test_browser import _open, _sign_in, browser, sync_api  # noqa: F401

LONG = "a_rather_long_name_for_a_value_that_runs_well_past_the_width_of_a_phone = 6 * 7"
PROGRAM = f"""import sys, time
time.sleep(2)
{LONG}
print("<b>not bold</b> & " + "wrapping words " * 12)
print(a_rather_long_name_for_a_value_that_runs_well_past_the_width_of_a_phone)
print("warning: <script>alert(1)</script>", file=sys.stderr)
sys.exit(3)"""
TASK = f"Compute:\n```python\n{PROGRAM}\n```"
# Every block inside the transcript ends within the window (wrapping or scrolling inside).
BLOCKS_INSIDE = """() => Array.from(document.querySelectorAll("#run-transcript pre"),
  (pre) => pre.getBoundingClientRect().right <= window.innerWidth)"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with gateway_with_node(tmp_path_factory.mktemp("transcript-browser")) as process:
        yield process


def _agent(w, gateway, project_id: str) -> None:
    page = w.page
    page.goto(f"{gateway.url}/console/projects/{project_id}/sandboxes")
    page.get_by_role("button", name="Create sandbox").click()
    sync_api.expect(page.get_by_role("cell", name="python")).to_be_visible()
    page.goto(f"{gateway.url}/console/projects/{project_id}/agents")
    page.get_by_label("Name").fill("Calculator")
    page.locator("select[name=model]").select_option("echo-1")
    page.get_by_label("Instructions").fill("Run the code you are given.")
    page.locator("select[name=sandbox_id]").select_option(index=0)
    page.get_by_role("button", name="Create agent").click()
    page.wait_for_url(re.compile(r".*/console/agents/agt_[0-9a-f]+$"))


def _transcript_reads_right(w) -> None:
    expect = sync_api.expect
    steps = w.page.locator("#run-transcript > li")
    expect(steps).to_have_count(3)
    model, sandbox, answer = steps.nth(0), steps.nth(1), steps.nth(2)
    expect(model.locator(".step-title")).to_have_text("Step 1 · model · echo-1")
    expect(model.locator(".msg.system pre")).to_have_text("Run the code you are given.")
    expect(model.locator(".msg.user pre")).to_have_text(TASK)
    expect(model.locator(".call")).to_have_text("Calls run_code (python)")
    expect(model.locator(".msg.assistant pre.code")).to_have_text(PROGRAM + "\n")
    expect(sandbox.locator(".step-title")).to_have_text("Step 2 · sandbox · python")
    expect(sandbox.locator("pre.code")).to_have_text(PROGRAM + "\n")
    expect(sandbox.locator("pre.stdout")).to_contain_text("<b>not bold</b> & wrapping words")
    expect(sandbox.locator("pre.stdout")).to_contain_text("\n42\n")
    expect(sandbox.locator("pre.stderr")).to_have_text("warning: <script>alert(1)</script>\n")
    expect(sandbox.locator(".exit")).to_have_text("Exit code 3 · failed")
    expect(answer.locator(".msg.tool pre")).to_contain_text("[status: failed, exit code 3]")
    expect(answer.locator(".msg.assistant")).to_be_visible()
    expect(w.page.locator('#run-transcript a[href^="/proofs/rcpt_"]')).to_have_count(3)
    # The program's HTML is text: nothing of it became an element.
    expect(w.page.locator("#run-transcript b, #run-transcript script")).to_have_count(0)
    assert all(w.page.evaluate(BLOCKS_INSIDE))


@pytest.mark.parametrize(("width", "height"), [(1280, 800), (390, 844)])
def test_a_runs_transcript_step_by_step(browser, gateway, tmp_path, width, height):  # noqa: F811
    expect = sync_api.expect
    w = _open(browser, gateway, tmp_path, width, height)
    page = w.page
    _sign_in(w, gateway)
    project_id = gateway.create_project(f"transcript {width}", "--balance", "5")
    _agent(w, gateway, project_id)
    page.get_by_label("Input").fill(TASK)
    page.get_by_role("button", name="Start run").click()
    page.wait_for_url(re.compile(r".*/console/agents/agt_[0-9a-f]+/runs/run_[0-9a-f]+$"))
    # Drawn live: the first step's transcript while the program still sleeps.
    expect(page.locator("#run-transcript > li")).to_have_count(1, timeout=20_000)
    expect(page.locator("#run-status")).to_have_text("running")
    expect(page.locator("#run-status")).to_have_text("completed", timeout=30_000)
    _transcript_reads_right(w)
    w.clean("live transcript")
    # The server renders the same transcript on a reload, from the records.
    page.reload()
    _transcript_reads_right(w)
    page.locator("#run-transcript").scroll_into_view_if_needed()
    w.shot("run-transcript")
