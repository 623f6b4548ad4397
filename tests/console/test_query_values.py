"""Every query value and header the console parses: a bad one is a 400 `invalid_request`
naming it (the query name, or the header name), on JSON endpoints and pages alike; never
a 500, nor a stream cut mid-body."""

from __future__ import annotations

import pytest

from tests.console.agents_support import start_run, wait_run
from tests.console.support import ConsoleClient

MAX = 2**63 - 1
# Digits that are not ASCII ("²".isdigit() is true, int("²") fails), signs, fractions,
# numbers beyond 64 bits, and beyond what int() reads at all.
BAD_NUMBERS = ["²", "٣", "-1", "+1", "1.5", "1e3", " 1", "", "abc", str(MAX + 1), "9" * 5000]
BAD_LIMITS = [*BAD_NUMBERS, "0", "201"]
BAD_DATES = ["9999-12-31", "²⁰²⁴-01-01", "2026-13-01", "2026-W01-1", "20260101", "yesterday", ""]

# (path under the project, its kind, the query name, bad values)
QUERIES = [
    ("/console/api/projects/{pid}/receipts", "json", "limit", BAD_LIMITS),
    ("/console/api/projects/{pid}/receipts", "json", "cursor", BAD_NUMBERS),
    ("/console/api/projects/{pid}/ledger", "json", "limit", BAD_LIMITS),
    ("/console/api/projects/{pid}/ledger", "json", "cursor", BAD_NUMBERS),
    ("/console/api/projects/{pid}/usage", "json", "from", BAD_DATES),
    ("/console/api/projects/{pid}/usage", "json", "to", BAD_DATES),
    ("/console/api/projects/{pid}/usage", "json", "group_by", ["colour", "²"]),
    ("/console/projects/{pid}/receipts", "page", "cursor", BAD_NUMBERS),
    ("/console/projects/{pid}/ledger", "page", "cursor", BAD_NUMBERS),
    ("/console/projects/{pid}/usage", "page", "from", BAD_DATES),
    ("/console/projects/{pid}/usage", "page", "to", BAD_DATES),
]
CASES = [
    pytest.param(path, kind, name, value, id=f"{path.split('/')[-1]}-{kind}-{name}-{value[:12]!r}")
    for path, kind, name, values in QUERIES
    for value in values
]


@pytest.fixture(scope="module")
def pid(gateway) -> str:
    client = ConsoleClient(gateway)
    client.login("owner@example.com")
    created = client.post("/console/api/projects", {"name": "queries"}).json()
    client.close()
    return created["id"]


def _bad(response, kind: str, param: str) -> None:
    assert response.status_code == 400, (response.status_code, response.text[:300])
    if kind == "json":
        error = response.json()["error"]
        assert error["type"] == "invalid_request" and error["param"] == param
        assert error["request_id"] == response.headers["x-request-id"]
    else:
        assert response.headers["content-type"].startswith("text/html")
        assert "<h1>400</h1>" in response.text


@pytest.mark.parametrize(("path", "kind", "name", "value"), CASES)
def test_a_bad_query_value_is_400_naming_it(owner, pid, path, kind, name, value):
    _bad(owner.get(path.format(pid=pid), params={name: value}), kind, name)


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/console/api/projects/{pid}/receipts", {"limit": "200", "cursor": str(MAX)}),
        ("/console/api/projects/{pid}/ledger", {"limit": "1", "cursor": "0"}),
        ("/console/api/projects/{pid}/usage", {"from": "0001-01-01", "to": "9999-12-30"}),
        ("/console/projects/{pid}/receipts", {"cursor": str(MAX)}),
        ("/console/projects/{pid}/ledger", {"cursor": "0"}),
        ("/console/projects/{pid}/usage", {"from": "9999-12-01", "to": "9999-12-30"}),
    ],
)
def test_the_edges_of_good_values_are_answered(owner, pid, path, params):
    assert owner.get(path.format(pid=pid), params=params).status_code == 200


# "²" as Latin-1 (how the header is read) and as UTF-8.
@pytest.mark.parametrize(
    "value", [b"\xb2", "²".encode(), b"-1", b"abc", b"1.5", str(MAX + 1).encode(), b"9" * 5000]
)
def test_a_bad_last_event_id_is_400_before_the_stream_starts(owner, funded, value):
    agent = owner.post(
        f"/console/api/projects/{funded['id']}/agents", {"name": "events", "model": "echo-1"}
    ).json()
    run = start_run(owner, agent["id"], "hello", "0.10")
    assert wait_run(owner, agent["id"], run["id"])["status"] == "completed"
    path = f"/console/api/agents/{agent['id']}/runs/{run['id']}/events"
    _bad(owner.get(path, headers={"last-event-id": value}), "json", "Last-Event-ID")
    # A good one resumes after that step; none (or empty) starts from the first.
    for header, steps in (({"last-event-id": b"0"}, 0), ({}, 1), ({"last-event-id": b""}, 1)):
        answer = owner.get(path, headers=header)
        assert answer.status_code == 200
        assert answer.text.count("event: step\n") == steps and "event: end" in answer.text


def test_the_usage_page_says_when_it_shows_another_range_than_asked(owner, pid):
    page = owner.get(
        f"/console/projects/{pid}/usage", params={"from": "2026-02-02", "to": "2026-02-01"}
    )
    assert page.status_code == 200
    assert "'From' is after 'To': showing this month instead." in page.text.replace("&#x27;", "'")
    wide = owner.get(
        f"/console/projects/{pid}/usage", params={"from": "2020-01-01", "to": "2026-01-01"}
    )
    assert wide.status_code == 200 and "showing this month instead" in wide.text
    plain = owner.get(f"/console/projects/{pid}/usage")
    assert "showing this month instead" not in plain.text
    # The JSON endpoint refuses the range, naming a bound.
    api = owner.get(
        f"/console/api/projects/{pid}/usage", params={"from": "2026-02-02", "to": "2026-02-01"}
    )
    assert api.status_code == 400 and api.json()["error"]["param"] in ("from", "to")


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_a_body_of_another_content_type_is_400_naming_the_header(owner, content_type):
    sent = owner.request(
        "POST",
        "/console/api/projects",
        content=b'{"name": "x"}',
        headers={"content-type": content_type},
    )
    _bad(sent, "json", "Content-Type")
