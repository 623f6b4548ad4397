"""The playground (the /v1 chain with the session as principal) and the reports it feeds:
usage, receipts and ledger with their cursors, over real HTTP."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime

import httpx

from tests.console.support import error_type
from tests.support.http import bearer, chat_body


def _play(client, project_id: str, path: str, body: dict) -> httpx.Response:
    return client.post(f"/console/api/projects/{project_id}/playground/{path}", body)


def test_playground_chat_is_billed_and_receipted_to_the_project(owner, funded):
    pid = funded["id"]
    response = _play(owner, pid, "chat/completions", chat_body())
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "chat.completion"
    receipt_id = response.headers["x-receipt-id"]
    (receipt,) = owner.get(f"/console/api/projects/{pid}/receipts").json()["data"]
    assert receipt["id"] == receipt_id and receipt["endpoint"] == "/v1/chat/completions"
    shown = owner.get(f"/console/api/projects/{pid}").json()
    assert shown["balance"] == f"{5 - float(receipt['cost']):.6f}"
    assert shown["reserved"] == "0.000000"


def test_playground_streams_chat_and_responses(owner, funded):
    pid = funded["id"]
    url = f"/console/api/projects/{pid}/playground/chat/completions"
    with owner.http.stream(
        "POST", url, json=chat_body(stream=True, messages=[{"role": "user", "content": "a b c"}])
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers["x-receipt-id"].startswith("rcpt_")
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 3
    body = {"model": "echo-1", "input": "hello there", "stream": True}
    with owner.http.stream(
        "POST", f"/console/api/projects/{pid}/playground/responses", json=body
    ) as stream:
        assert stream.status_code == 200
        events = [line for line in stream.iter_lines() if line.startswith("event: ")]
    assert events[-1] == "event: response.completed"


def test_playground_runs_the_same_validation_and_money_rules(owner, project, funded):
    pid = project["id"]
    bad = _play(owner, pid, "chat/completions", {"model": "echo-1"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
    unknown = _play(owner, pid, "chat/completions", chat_body(model="nope"))
    assert unknown.status_code == 404 and error_type(unknown) == "model_not_found"
    # A fresh project has no money: 402 and nothing billed.
    empty = owner.post("/console/api/projects", {"name": "empty"}).json()
    broke = _play(owner, empty["id"], "chat/completions", chat_body())
    assert broke.status_code == 402 and error_type(broke) == "insufficient_balance"
    assert owner.get(f"/console/api/projects/{empty['id']}/receipts").json()["data"] == []


def test_playground_sandbox_executions_take_the_v1_path(owner, funded):
    pid = funded["id"]
    sandbox = owner.post(f"/console/api/projects/{pid}/sandboxes", {"runtime": "python"}).json()
    body = {"sandbox_id": sandbox["id"], "runtime": "python", "code": "print(1)"}
    # This deployment has no sandbox node: the /v1 answer, 502 sandbox_error, nothing billed.
    response = _play(owner, pid, "sandbox/executions", body)
    assert response.status_code == 502 and error_type(response) == "sandbox_error"
    too_big = _play(owner, pid, "sandbox/executions", {**body, "code": "x" * (101 * 1024)})
    assert too_big.status_code == 400
    assert owner.get(f"/console/api/projects/{pid}").json()["reserved"] == "0.000000"
    assert owner.get(f"/console/api/projects/{pid}/receipts").json()["data"] == []


def test_usage_groups_by_day_model_and_key(gateway, owner, funded):
    pid = funded["id"]
    key = owner.post(f"/console/api/projects/{pid}/keys", {"scopes": ["inference"]}).json()
    for _ in range(2):
        assert _play(owner, pid, "chat/completions", chat_body()).status_code == 200
    v1 = httpx.post(
        gateway.url + "/v1/chat/completions",
        json=chat_body(model="echo-notools"),
        headers=bearer(key["key"]),
    )
    assert v1.status_code == 200
    base = f"/console/api/projects/{pid}/usage"
    by_model = owner.get(base, params={"group_by": "model"}).json()
    rows = {row["group"]: row for row in by_model["data"]}
    assert rows["echo-1"]["requests"] == 2 and rows["echo-notools"]["requests"] == 1
    assert by_model["total"]["requests"] == 3
    assert by_model["total"]["input_tokens"] == sum(r["input_tokens"] for r in rows.values())
    by_key = {
        row["group"]: row for row in owner.get(base, params={"group_by": "key"}).json()["data"]
    }
    assert by_key[key["prefix"]]["requests"] == 1 and by_key[None]["requests"] == 2
    today = datetime.now(UTC).date().isoformat()
    by_day = owner.get(base, params={"from": today, "to": today}).json()
    assert [row["group"] for row in by_day["data"]] == [today]
    assert by_day["data"][0]["cost"] == by_model["total"]["cost"]
    empty = owner.get(base, params={"from": "2020-01-01", "to": "2020-01-31"}).json()
    assert empty["data"] == [] and empty["total"]["cost"] == "0.000000"
    for params, param in [
        ({"group_by": "colour"}, "group_by"),
        ({"from": "yesterday"}, "from"),
        ({"from": "2026-02-02", "to": "2026-02-01"}, "to"),
    ]:
        response = owner.get(base, params=params)
        assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_receipts_and_ledger_pages_newest_first(owner, funded):
    pid = funded["id"]
    made = [
        _play(owner, pid, "chat/completions", chat_body()).headers["x-receipt-id"] for _ in range(3)
    ]
    first = owner.get(f"/console/api/projects/{pid}/receipts", params={"limit": 2}).json()
    assert [r["id"] for r in first["data"]] == made[::-1][:2]
    assert first["next_cursor"] is not None
    second = owner.get(
        f"/console/api/projects/{pid}/receipts", params={"limit": 2, "cursor": first["next_cursor"]}
    ).json()
    assert [r["id"] for r in second["data"]] == [made[0]] and second["next_cursor"] is None
    ledger = owner.get(f"/console/api/projects/{pid}/ledger", params={"limit": 3}).json()
    assert [e["kind"] for e in ledger["data"]] == ["charge"] * 3
    assert [e["receipt_id"] for e in ledger["data"]] == made[::-1]
    rest = owner.get(
        f"/console/api/projects/{pid}/ledger", params={"cursor": ledger["next_cursor"]}
    ).json()
    assert [e["kind"] for e in rest["data"]] == ["payment"] and rest["next_cursor"] is None
    assert rest["data"][0]["amount"] == "5.000000" and rest["data"][0]["reference"]
    for params in ({"limit": 0}, {"limit": 1000}, {"cursor": "abc"}):
        assert owner.get(f"/console/api/projects/{pid}/receipts", params=params).status_code == 400


def _older_link(page: str) -> str | None:
    """The page's "Older entries" link, if it has one."""
    found = re.search(r'<p class="more"><a href="([^"]+)">Older entries</a>', page)
    return None if found is None else html.unescape(found[1])


def test_older_entries_pages_miss_no_entry(owner, funded):
    """The receipts and ledger pages show 50 entries each and link to the older ones: the
    link starts after the last entry shown (it started after the first one not shown, the
    51st, which no page showed)."""
    pid = funded["id"]
    references = [f"PAGE-{n:02d}" for n in range(30)]
    for reference in references:
        paid = owner.post(
            f"/console/api/projects/{pid}/payments", {"amount": "0.01", "reference": reference}
        )
        assert paid.status_code == 201, paid.text
    made = [
        _play(owner, pid, "chat/completions", chat_body()).headers["x-receipt-id"]
        for _ in range(51)
    ]
    # The ledger: 81 entries and the funding payment; the receipts: 51.
    for tab, wanted in (("ledger", references + made), ("receipts", made)):
        pages, link = [], f"/console/projects/{pid}/{tab}"
        while link is not None:
            pages.append(owner.get(link).text)
            link = _older_link(pages[-1])
        assert len(pages) == 2, tab
        shown = {ref: sum(ref in page for page in pages) for ref in wanted}
        assert {ref for ref, times in shown.items() if times != 1} == set(), tab
