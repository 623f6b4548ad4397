"""The console's agents API over real HTTP: a real `gateway serve`, the real sandbox node,
the echo model (which calls run_code for a fenced python block), real SQLite."""

from __future__ import annotations

import time
from decimal import Decimal

import httpx
import pytest

from model_gateway.gateway.console.html import usd_text
from tests.console.agents_support import (
    SIX_TIMES_SEVEN,
    SLOW,
    events,
    gateway_with_node,
    start_run,
    tool_agent,
    wait_run,
)
from tests.console.support import error_type


def proof_status(base: str, receipt_id: str) -> int:
    """The proof page's status once the log has taken the receipt (202 while pending)."""
    deadline = time.monotonic() + 15
    while True:
        answer = httpx.get(f"{base}/proofs/{receipt_id}")
        if answer.status_code != 202 or time.monotonic() > deadline:
            return answer.status_code
        time.sleep(0.2)


STEP_FIELDS = {
    "kind",
    "input_tokens",
    "output_tokens",
    "duration_ms",
    "cost",
    "receipt_id",
    "error",
    "transcript",
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with gateway_with_node(tmp_path_factory.mktemp("console-agents")) as process:
        yield process


def test_a_run_completes_with_a_tool_step_and_streams_its_steps(owner, funded):
    project_id = funded["id"]
    agent = tool_agent(owner, project_id)
    assert agent["id"].startswith("agt_") and agent["max_steps"] == 8
    listed = owner.get(f"/console/api/projects/{project_id}/agents").json()
    assert listed["object"] == "list" and listed["next_cursor"] is None
    assert [a["id"] for a in listed["data"]] == [agent["id"]]

    run = start_run(owner, agent["id"], SIX_TIMES_SEVEN, "0.50")
    assert run["id"].startswith("run_") and run["status"] == "running"
    assert run["budget"] == "0.500000"
    seen = list(events(owner, agent["id"], run["id"]))
    steps = [data for name, data in seen if name == "step"]
    name, end = seen[-1]
    assert name == "end"
    assert (end["status"], end["output"], end["error"]) == ("completed", "42\n", None)
    assert [(s["kind"], s.get("model") or s.get("runtime")) for s in steps] == [
        ("model", "echo-1"),
        ("sandbox", "python"),
        ("model", "echo-1"),
    ]
    for step in steps:
        assert STEP_FIELDS | {"model" if step["kind"] == "model" else "runtime"} == set(step)
        assert step["receipt_id"].startswith("rcpt_") and Decimal(step["cost"]) > 0
    assert steps[0]["output_tokens"] > 0 and steps[1]["duration_ms"] > 0
    assert end["steps"] == steps
    assert Decimal(end["spent"]) == sum(Decimal(s["cost"]) for s in steps) <= Decimal("0.5")

    shown = owner.get(f"/console/api/agents/{agent['id']}/runs/{run['id']}").json()
    assert shown == end
    # Each step's receipt is a real one with a public proof page.
    for step in steps:
        assert proof_status(owner.gateway.url, step["receipt_id"]) == 200
    # A stream opened after the end replays the same steps, then the end.
    late = list(events(owner, agent["id"], run["id"]))
    assert [d for n, d in late if n == "step"] == steps and late[-1] == ("end", end)
    # Last-Event-ID resumes after the step it names.
    path = f"/console/api/agents/{agent['id']}/runs/{run['id']}/events"
    resumed = owner.get(path, headers={"last-event-id": "1"}).text
    assert resumed.count("event: step\n") == 1 and "id: 2\n" in resumed


def test_a_tiny_budget_ends_the_run_before_its_first_step(owner, funded):
    agent = tool_agent(owner, funded["id"])
    run = start_run(owner, agent["id"], SIX_TIMES_SEVEN, "0.000001")
    ended = wait_run(owner, agent["id"], run["id"])
    assert ended["status"] == "budget_exceeded"
    assert ended["error"]["type"] == "budget_exceeded"
    assert ended["steps"] == [] and Decimal(ended["spent"]) == 0
    assert list(events(owner, agent["id"], run["id"])) == [("end", ended)]
    receipts = owner.get(f"/console/api/projects/{funded['id']}/receipts").json()["data"]
    assert receipts == []


def test_a_cancelled_run_settles_and_cannot_be_cancelled_again(owner, funded):
    agent = tool_agent(owner, funded["id"], timeout_s=30)
    run = start_run(owner, agent["id"], SLOW, "0.50")
    base = f"/console/api/agents/{agent['id']}/runs/{run['id']}"
    stream = events(owner, agent["id"], run["id"])
    for name, data in stream:  # up to the sandbox step's announcement: it runs now
        assert name != "end"
        if name == "step.started" and data["kind"] == "sandbox":
            break
    stream.close()
    asked = owner.post(base + "/cancel")
    assert asked.status_code == 200, asked.text
    assert asked.json()["cancel_requested"] is True
    ended = wait_run(owner, agent["id"], run["id"], timeout=8)  # not the program's 10 s
    assert (ended["status"], ended["error"]["type"]) == ("cancelled", "cancelled")
    sandbox_step = ended["steps"][-1]
    assert sandbox_step["kind"] == "sandbox" and sandbox_step["error"]["type"] == "cancelled"
    assert Decimal(ended["spent"]) == sum(Decimal(s["cost"]) for s in ended["steps"]) > 0
    again = owner.post(base + "/cancel")
    assert again.status_code == 409 and error_type(again) == "conflict"


def test_bodies_are_checked_with_the_field_named(owner, funded):
    path = f"/console/api/projects/{funded['id']}/agents"
    missing = owner.post(path, {"name": "a", "model": "echo-1", "tools": ["sandbox"]})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "sandbox_id"
    wrong = owner.post(path, {"name": "a", "model": "echo-1", "max_steps": "8"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "max_steps"
    unknown = owner.post(path, {"name": "a", "model": "no-such-model"})
    assert unknown.status_code == 404
    agent = owner.post(path, {"name": "plain", "model": "echo-1"}).json()
    bad_budget = owner.post(
        f"/console/api/agents/{agent['id']}/runs", {"input": "hi", "budget": "lots"}
    )
    assert bad_budget.status_code == 400 and bad_budget.json()["error"]["param"] == "budget"
    for huge in ("1e30", "1E+999999", 1e300):  # beyond storage's integers: were 500s
        too_big = owner.post(
            f"/console/api/agents/{agent['id']}/runs", {"input": "hi", "budget": huge}
        )
        assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "budget"


def test_a_run_is_found_only_under_its_own_agent(owner, funded):
    path = f"/console/api/projects/{funded['id']}/agents"
    first = owner.post(path, {"name": "one", "model": "echo-1"}).json()
    second = owner.post(path, {"name": "two", "model": "echo-1"}).json()
    run = start_run(owner, first["id"], "hello", "0.10")
    assert wait_run(owner, first["id"], run["id"])["status"] == "completed"
    for suffix in ("", "/events"):
        crossed = owner.get(f"/console/api/agents/{second['id']}/runs/{run['id']}{suffix}")
        assert crossed.status_code == 404 and error_type(crossed) == "not_found"
    crossed = owner.post(f"/console/api/agents/{second['id']}/runs/{run['id']}/cancel")
    assert crossed.status_code == 404


def test_members_see_agents_of_granted_projects_only(gateway, owner, member, member_email, funded):
    project_id = funded["id"]
    agent = owner.post(
        f"/console/api/projects/{project_id}/agents", {"name": "private", "model": "echo-1"}
    ).json()
    run = start_run(owner, agent["id"], "hello", "0.10")
    run_path = f"/console/api/agents/{agent['id']}/runs/{run['id']}"
    refused = [
        member.get(f"/console/api/projects/{project_id}/agents"),
        member.post(f"/console/api/projects/{project_id}/agents", {"name": "x", "model": "echo-1"}),
        member.post(f"/console/api/agents/{agent['id']}/runs", {"input": "x", "budget": "1"}),
        member.get(run_path),
        member.get(run_path + "/events"),
        member.post(run_path + "/cancel"),
        member.get(f"/console/agents/{agent['id']}"),
        member.get(f"/console/agents/{agent['id']}/runs/{run['id']}"),
    ]
    assert [r.status_code for r in refused] == [404] * len(refused)
    assert agent["id"] not in "".join(member.seen)
    gateway.cli("users", "grant", member_email, "--project", project_id)
    listed = member.get(f"/console/api/projects/{project_id}/agents").json()["data"]
    assert [a["id"] for a in listed] == [agent["id"]]
    assert member.get(run_path).status_code == 200


def test_a_foreign_origin_is_refused_before_anything_happens(owner, funded):
    path = f"/console/api/projects/{funded['id']}/agents"
    foreign = {"origin": "https://evil.example"}
    created = owner.post(path, {"name": "x", "model": "echo-1"}, headers=foreign)
    assert created.status_code == 403 and error_type(created) == "forbidden"
    assert owner.get(path).json()["data"] == []
    agent = owner.post(
        path, {"name": "y", "model": "echo-1"}, headers={"origin": owner.gateway.url}
    )
    assert agent.status_code == 201
    run = owner.post(
        f"/console/api/agents/{agent.json()['id']}/runs",
        {"input": "x", "budget": "0.1"},
        headers=foreign,
    )
    assert run.status_code == 403


def test_without_a_session_everything_is_401(gateway, owner, funded):
    agent = owner.post(
        f"/console/api/projects/{funded['id']}/agents", {"name": "z", "model": "echo-1"}
    ).json()
    run = start_run(owner, agent["id"], "hello", "0.10")
    run_path = f"/console/api/agents/{agent['id']}/runs/{run['id']}"
    with httpx.Client(base_url=gateway.url) as anonymous:
        answers = [
            anonymous.get(f"/console/api/projects/{funded['id']}/agents"),
            anonymous.post(f"/console/api/projects/{funded['id']}/agents", json={}),
            anonymous.post(f"/console/api/agents/{agent['id']}/runs", json={}),
            anonymous.get(run_path),
            anonymous.get(run_path + "/events"),
            anonymous.post(run_path + "/cancel", json={}),
        ]
        assert [(a.status_code, error_type(a)) for a in answers] == [
            (401, "unauthenticated")
        ] * len(answers)
        page = anonymous.get(f"/console/agents/{agent['id']}/runs/{run['id']}")
        assert page.status_code == 303 and page.headers["location"] == "/console/login"


def test_pages_are_server_rendered_under_the_strict_csp(owner, funded):
    agent = tool_agent(owner, funded["id"])
    run = start_run(owner, agent["id"], SIX_TIMES_SEVEN, "0.50")
    ended = wait_run(owner, agent["id"], run["id"])
    pages = [
        f"/console/projects/{funded['id']}/agents",
        f"/console/agents/{agent['id']}",
        f"/console/agents/{agent['id']}/runs/{run['id']}",
    ]
    for path in pages:
        page = owner.get(path)
        assert page.status_code == 200, path
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert " style=" not in page.text and "<script>" not in page.text
    html = owner.get(pages[-1]).text
    for step in ended["steps"]:
        assert f'href="/proofs/{step["receipt_id"]}"' in html
    assert 'data-running="false"' in html and 'id="run-cancel"' not in html
    assert f">{usd_text(ended['spent'])}</span> of" in html and "42\n</pre>" in html


def test_an_archived_project_keeps_its_agents_read_only(owner, funded):
    path = f"/console/api/projects/{funded['id']}/agents"
    agent = owner.post(path, {"name": "old", "model": "echo-1"}).json()
    assert owner.post(f"/console/api/projects/{funded['id']}/archive").status_code == 200
    created = owner.post(path, {"name": "new", "model": "echo-1"})
    assert created.status_code == 409 and error_type(created) == "conflict"
    started = owner.post(f"/console/api/agents/{agent['id']}/runs", {"input": "x", "budget": "1"})
    assert started.status_code == 409
    assert [a["id"] for a in owner.get(path).json()["data"]] == [agent["id"]]
    page = owner.get(f"/console/agents/{agent['id']}").text
    assert "Start run" not in page
