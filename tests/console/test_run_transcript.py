"""A run's transcript, step by step, over real HTTP: a real `gateway serve`, the real
sandbox node, the echo model (which calls run_code for a fenced python block), real
SQLite. The API's steps and the run's events carry each step's transcript; the run page
shows the messages, the code, stdout, stderr and "Exit code N" with each step's receipt,
every value escaped; output past the bound is cut and says so."""

from __future__ import annotations

import json
import re
from html import escape

import pytest

from model_gateway.gateway.agents.transcript import TEXT_BYTES
from tests.console.agents_support import (
    SLOW,
    events,
    gateway_with_node,
    start_run,
    tool_agent,
    wait_run,
)

NOISY = (
    "Run this:\n```python\nimport sys\n"
    "print('<script>alert(1)</script> & <b>bold</b>')\n"
    "print('<img src=x onerror=alert(2)>', file=sys.stderr)\n"
    "sys.exit(3)\n```\n"
)
CHATTY = "Flood:\n```python\nprint('y' * 200_000)\n```\n"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with gateway_with_node(tmp_path_factory.mktemp("run-transcript")) as process:
        yield process


def _run(owner, project_id: str, text: str) -> tuple[dict, dict, str]:
    """The finished run as the API shows it, as its events streamed it, and its page."""
    agent = tool_agent(owner, project_id)
    run = start_run(owner, agent["id"], text, "0.50")
    ((_, end),) = [e for e in events(owner, agent["id"], run["id"]) if e[0] == "end"]
    shown = owner.get(f"/console/api/agents/{agent['id']}/runs/{run['id']}").json()
    page = owner.get(f"/console/agents/{agent['id']}/runs/{run['id']}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    return shown, end, page.text


def _transcript_html(page: str) -> str:
    found = re.search(r'<ol id="run-transcript".*?</ol>', page, re.S)
    assert found, "the page has no transcript"
    return found.group(0)


def test_each_steps_transcript_in_the_api_and_on_the_page(owner, funded):
    shown, end, page = _run(owner, funded["id"], NOISY)
    assert shown["status"] == "completed", shown
    assert end["steps"] == shown["steps"]  # the events carry the same transcripts
    first, sandbox, last = shown["steps"]

    # The model step: what was sent new (the input), the reply (a run_code call).
    assert first["transcript"]["messages"] == [{"role": "user", "content": NOISY}]
    (call,) = first["transcript"]["reply"]["tool_calls"]
    assert call["name"] == "run_code"
    code = json.loads(call["arguments"])["code"]
    assert "sys.exit(3)" in code
    # The sandbox step: its program and what it did.
    assert sandbox["transcript"] == {
        "runtime": "python",
        "code": code,
        "stdout": "<script>alert(1)</script> & <b>bold</b>\n",
        "stderr": "<img src=x onerror=alert(2)>\n",
        "exit_code": 3,
        "status": "failed",  # the program's, not the run's: it completed
    }
    # The next model step was sent only the tool's result, new since its last reply.
    (tool,) = last["transcript"]["messages"]
    assert tool["role"] == "tool" and "<b>bold</b>" in tool["content"]
    assert last["transcript"]["reply"]["tool_calls"] == []

    html = _transcript_html(page)
    items = re.findall(r'<li class="step".*?</li>', html, re.S)
    assert len(items) == 3
    for item, step in zip(items, shown["steps"], strict=True):
        assert f'href="/proofs/{step["receipt_id"]}"' in item
    assert "Step 2 · sandbox · python" in items[1]
    assert f'<pre class="code">{escape(code)}</pre>' in items[1]
    assert escape("<script>alert(1)</script> & <b>bold</b>") in items[1]
    assert escape("<img src=x onerror=alert(2)>") in items[1]
    assert "Exit code 3" in items[1] and 'data-ok="false"' in items[1]
    assert "<script>" not in html and "<img" not in html and "<b>" not in html
    assert escape(NOISY) in items[0] and '<span class="who">Input</span>' in items[0]
    assert "Calls <code>run_code</code> (python)" in items[0]
    assert '<span class="who">Tool result</span>' in items[2]


def test_output_past_the_bound_is_cut_and_flagged(owner, funded):
    shown, _, page = _run(owner, funded["id"], CHATTY)
    _, sandbox, last = shown["steps"]
    assert shown["status"] == "completed", shown
    out = sandbox["transcript"]
    assert out["stdout_truncated"] is True and out["stdout"] == "y" * len(out["stdout"])
    assert 0 < len(out["stdout"].encode()) <= TEXT_BYTES
    assert out["stderr"] == "" and "stderr_truncated" not in out
    # The tool result the model read next (the output and a note) is cut too.
    (tool,) = last["transcript"]["messages"]
    assert tool["truncated"] is True and len(tool["content"].encode()) == TEXT_BYTES
    html = _transcript_html(page)
    assert html.count("Cut at 64 KiB.") == 2
    assert '<pre class="stream stderr"></pre>' in html  # empty: shown as "(empty)" by CSS


def test_a_cancelled_sandbox_step_keeps_its_program(owner, funded):
    agent = tool_agent(owner, funded["id"])
    run = start_run(owner, agent["id"], SLOW, "0.50")
    for name, data in events(owner, agent["id"], run["id"]):
        if name == "step.started" and data.get("runtime") == "python":  # the program runs
            break
    else:
        raise AssertionError("no sandbox step started")
    path = f"/console/api/agents/{agent['id']}/runs/{run['id']}"
    assert owner.post(path + "/cancel").status_code == 200
    shown = wait_run(owner, agent["id"], run["id"])
    assert shown["status"] == "cancelled"
    sandbox = shown["steps"][1]
    assert sandbox["transcript"] == {"runtime": "python", "code": "import time\ntime.sleep(10)\n"}
    page = owner.get(f"/console/agents/{agent['id']}/runs/{run['id']}").text
    item = re.findall(r'<li class="step".*?</li>', _transcript_html(page), re.S)[1]
    assert "The program did not finish: no output." in item and "Exit code" not in item
