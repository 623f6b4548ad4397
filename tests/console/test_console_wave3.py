"""The console's wave-3 additions over HTTP against a real `gateway serve`: receipts
filtered by model, key, status and dates (the URL carries them; a bad one is 400 naming
it), a key's own API and page, the overview's trend and month against budget, exact
against the receipts of real traffic, and amounts shown with their currency."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import pytest

from model_gateway.gateway.console.html import usd
from tests.console.support import ConsoleClient
from tests.support.http import bearer, chat_body

TODAY = datetime.now(UTC).date()


@pytest.fixture(scope="module")
def traffic(gateway):
    """A funded project with a budget, two keys, and four requests: key A on echo-1 twice
    and on org/echo-2 once, key B on org/echo-2 once."""
    client = ConsoleClient(gateway)
    client.login("owner@example.com")
    project = client.post(
        "/console/api/projects", {"name": "wave3", "monthly_budget": "2.5"}
    ).json()
    pid = project["id"]
    paid = client.post(f"/console/api/projects/{pid}/payments", {"amount": "5", "reference": "W3"})
    assert paid.status_code == 201, paid.text
    expires = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)
    made = client.post(
        f"/console/api/projects/{pid}/keys",
        {
            "scopes": ["inference"],
            "name": "key A",
            "rpm": 120,
            "tpm": 50000,
            "models": ["echo-1", "org/echo-2"],
            "monthly_limit": "1.25",
            "expires_at": expires.isoformat().replace("+00:00", "Z"),
        },
    )
    assert made.status_code == 201, made.text
    key_b = client.post(f"/console/api/projects/{pid}/keys", {"scopes": ["inference"]}).json()
    sent = []
    for secret, model in (
        (made.json()["key"], "echo-1"),
        (made.json()["key"], "echo-1"),
        (made.json()["key"], "org/echo-2"),
        (key_b["key"], "org/echo-2"),
    ):
        answer = httpx.post(
            gateway.url + "/v1/chat/completions",
            json=chat_body(model, messages=[{"role": "user", "content": "count these words"}]),
            headers=bearer(secret),
        )
        assert answer.status_code == 200, answer.text
        sent.append(answer.headers["x-receipt-id"])
    yield {
        "client": client,
        "pid": pid,
        "a": made.json(),
        "b": key_b,
        "expires": expires,
        "receipts": sent,
    }
    client.close()


def _ids(client, pid, **params) -> list[str]:
    answer = client.get(f"/console/api/projects/{pid}/receipts", params=params)
    assert answer.status_code == 200, answer.text
    return [r["id"] for r in answer.json()["data"]]


def test_receipts_are_filtered_by_model_key_status_and_dates(traffic):
    client, pid, sent = traffic["client"], traffic["pid"], traffic["receipts"]
    a, b = traffic["a"]["prefix"], traffic["b"]["prefix"]
    newest_first = sent[::-1]
    assert _ids(client, pid) == newest_first
    assert _ids(client, pid, model="echo-1") == [sent[1], sent[0]]
    assert _ids(client, pid, key=b) == [sent[3]]
    assert _ids(client, pid, key=a, model="org/echo-2") == [sent[2]]
    assert _ids(client, pid, status="succeeded") == newest_first
    assert _ids(client, pid, status="failed") == []
    today = TODAY.isoformat()
    assert _ids(client, pid, **{"from": today, "to": today}) == newest_first
    assert _ids(client, pid, **{"from": (TODAY + timedelta(days=1)).isoformat()}) == []
    assert _ids(client, pid, to=(TODAY - timedelta(days=1)).isoformat()) == []
    # Empty values are no filter (what a plain GET form sends for fields left empty).
    assert _ids(client, pid, model="", key="", status="", **{"from": "", "to": ""}) == (
        newest_first
    )
    # Each receipt names its key's prefix (none for the console's own calls).
    listed = client.get(f"/console/api/projects/{pid}/receipts", params={"key": b}).json()
    assert [r["key"] for r in listed["data"]] == [b]


def test_filtered_receipts_page_through_with_cursors(traffic):
    client, pid, sent = traffic["client"], traffic["pid"], traffic["receipts"]
    seen, cursor = [], None
    for _ in range(5):
        params = {"key": traffic["a"]["prefix"], "limit": "1"}
        if cursor:
            params["cursor"] = cursor
        page = client.get(f"/console/api/projects/{pid}/receipts", params=params).json()
        seen += [r["id"] for r in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [sent[2], sent[1], sent[0]]


def test_the_receipts_page_shows_only_matches_and_keeps_the_filters_in_its_form(traffic):
    client, pid, sent = traffic["client"], traffic["pid"], traffic["receipts"]
    page = client.get(
        f"/console/projects/{pid}/receipts", params={"model": "echo-1", "status": "succeeded"}
    )
    assert page.status_code == 200
    shown = re.findall(r'href="/proofs/(rcpt_[0-9a-zA-Z]+)"', page.text)
    assert shown == [sent[1], sent[0]]
    assert 'name="model" type="text" value="echo-1"' in page.text
    assert '<option value="succeeded" selected>' in page.text
    assert 'method="get"' in page.text
    nothing = client.get(f"/console/projects/{pid}/receipts", params={"status": "failed"})
    assert "No receipt matches these filters." in nothing.text


BAD_FILTERS = [
    ("model", "m" * 201),
    ("model", "echo\n1"),
    ("status", "ok"),
    ("status", "SUCCEEDED"),
    ("key", "proj_live_nothere"),
    ("from", "2026-13-01"),
    ("from", "9999-12-31"),
    ("to", "yesterday"),
]


@pytest.mark.parametrize(("name", "value"), BAD_FILTERS)
def test_a_bad_filter_is_400_naming_it(traffic, name, value):
    client, pid = traffic["client"], traffic["pid"]
    api = client.get(f"/console/api/projects/{pid}/receipts", params={name: value})
    assert api.status_code == 400, api.text
    assert api.json()["error"]["type"] == "invalid_request"
    assert api.json()["error"]["param"] == name
    page = client.get(f"/console/projects/{pid}/receipts", params={name: value})
    assert page.status_code == 400 and "<h1>400</h1>" in page.text


def test_a_key_of_another_project_and_a_reversed_range_are_400(gateway, traffic):
    client, pid = traffic["client"], traffic["pid"]
    other = client.post("/console/api/projects", {"name": "other"}).json()
    foreign = client.post(f"/console/api/projects/{other['id']}/keys", {"scopes": ["inference"]})
    answer = client.get(
        f"/console/api/projects/{pid}/receipts", params={"key": foreign.json()["prefix"]}
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "key"
    backwards = client.get(
        f"/console/api/projects/{pid}/receipts", params={"from": "2026-02-02", "to": "2026-02-01"}
    )
    assert backwards.status_code == 400 and backwards.json()["error"]["param"] == "to"


def _costs(client, pid, **params) -> list[int]:
    listed = client.get(f"/console/api/projects/{pid}/receipts", params=params).json()["data"]
    return [int(Decimal(r["cost"]) * 1_000_000) for r in listed]


def test_a_keys_api_gives_its_limits_spend_and_last_use(traffic):
    client, pid, a = traffic["client"], traffic["pid"], traffic["a"]
    shown = client.get(f"/console/api/keys/{a['prefix']}")
    assert shown.status_code == 200, shown.text
    key = shown.json()
    assert key["rpm"] == 120 and key["tpm"] == 50000 and key["monthly_limit"] == "1.250000"
    assert key["models"] == ["echo-1", "org/echo-2"] and key["name"] == "key A"
    assert key["expires_at"] == traffic["expires"].isoformat().replace("+00:00", "Z")
    spent = sum(_costs(client, pid, key=a["prefix"]))
    assert spent > 0
    assert int(Decimal(key["month_spend"]) * 1_000_000) == spent
    assert key["last_used_at"] is not None and "key" not in key
    assert client.get("/console/api/keys/proj_live_nothere").status_code == 404


def test_a_key_is_hidden_from_a_member_without_the_project(traffic, member):
    prefix = traffic["a"]["prefix"]
    assert member.get(f"/console/api/keys/{prefix}").status_code == 404
    page = member.get(f"/console/keys/{prefix}")
    assert page.status_code == 404


def test_the_key_page_shows_limits_spend_and_its_recent_receipts(traffic):
    client, pid, a, sent = traffic["client"], traffic["pid"], traffic["a"], traffic["receipts"]
    page = client.get(f"/console/keys/{a['prefix']}")
    assert page.status_code == 200
    text = page.text
    spent = sum(_costs(client, pid, key=a["prefix"]))
    assert f"{usd(spent)} of its $1.25 monthly limit spent this month." in text
    for label, value in (("RPM", "120"), ("TPM", "50000"), ("Models", "echo-1, org/echo-2")):
        assert f"<dt>{label}</dt><dd>{value}</dd>" in text
    assert re.findall(r'href="/proofs/(rcpt_[0-9a-zA-Z]+)"', text) == [sent[2], sent[1], sent[0]]
    assert f"receipts?key={a['prefix']}" in text


def test_the_key_list_shows_rpm_tpm_and_the_monthly_limit(traffic):
    client, pid = traffic["client"], traffic["pid"]
    page = client.get(f"/console/projects/{pid}/keys").text
    for head in ("RPM", "TPM", "Monthly limit"):
        assert f"<th>{head}</th>" in page
    assert '<td data-label="RPM">120</td>' in page
    assert '<td data-label="TPM">50000</td>' in page
    assert '<td data-label="Monthly limit"><span class="num">$1.25</span></td>' in page
    for label in ("Expires at", "RPM", "TPM", "Models", "Monthly limit"):
        assert f"<label>{label}<input" in page


def test_the_overview_trend_and_month_are_exact_against_the_receipts(traffic):
    client, pid = traffic["client"], traffic["pid"]
    costs = _costs(client, pid)
    # The payment is not spend; the receipts of today are all of it.
    page = client.get(f"/console/projects/{pid}").text
    today = TODAY.isoformat()
    chart = rf'<svg class="chart small"[^>]*aria-label="([^"]+)">.*?data-day="{today}"'
    bars = dict(re.findall(chart + r' data-value="(\d+)"', page))
    assert bars == {"Requests per day": "4", "Spend per day": str(sum(costs))}
    assert page.count('<rect class="bar"') == 28  # 14 days in each chart
    assert f"{usd(sum(costs))} of the $2.50 monthly budget spent (0%)." in page
    assert "4 requests, " + usd(sum(costs)) + " spent" in page
    usage = client.get(
        f"/console/api/projects/{pid}/usage", params={"from": today, "to": today}
    ).json()
    assert usage["total"]["requests"] == 4
    assert int(Decimal(usage["total"]["cost"]) * 1_000_000) == sum(costs)


@pytest.mark.parametrize(
    ("micros", "shown"),
    [
        (0, "$0.00"),
        (1, "$0.000001"),
        (1_200, "$0.0012"),
        (120, "$0.00012"),
        (5_000_000, "$5.00"),
        (12_500_000, "$12.50"),
        (1_234_567_890_123, "$1,234,567.890123"),
        (2**63 - 1, "$9,223,372,036,854.775807"),
    ],
)
def test_amounts_are_shown_with_their_currency_exactly(micros, shown):
    assert usd(micros) == shown


def test_pages_show_amounts_with_the_currency(traffic):
    client, pid = traffic["client"], traffic["pid"]
    for path in ("", "/keys", "/usage", "/receipts", "/ledger"):
        text = client.get(f"/console/projects/{pid}{path}").text
        assert re.search(r'<span class="num">[+&minus;]*\$\d', text), path
        assert " USD<" not in text and not re.search(r'class="num">\d', text), path


def test_the_older_link_of_a_filtered_page_keeps_its_filters(gateway, owner):
    project = owner.post("/console/api/projects", {"name": "many"}).json()
    gateway.cli("credit", "add", "--project", project["id"], "5")
    key = gateway.create_key(project["id"])
    with httpx.Client(base_url=gateway.url, headers=bearer(key)) as client:
        for n in range(53):
            model = "org/echo-2" if n == 10 else "echo-1"
            assert client.post("/v1/chat/completions", json=chat_body(model)).status_code == 200
    path = f"/console/projects/{project['id']}/receipts"
    first = owner.get(path, params={"model": "echo-1"}).text
    assert first.count('href="/proofs/rcpt_') == 50
    older = re.search(r'<p class="more"><a href="([^"]+)">Older entries</a>', first)
    assert older is not None
    link = older.group(1).replace("&amp;", "&")
    assert link.startswith(path + "?model=echo-1&cursor=")
    rest = owner.get(link).text
    assert rest.count('href="/proofs/rcpt_') == 2 and "Older entries" not in rest


def test_a_keys_limits_change_and_clear_as_with_the_cli(gateway, owner, funded, member):
    made = owner.post(
        f"/console/api/projects/{funded['id']}/keys",
        {"scopes": ["inference"], "rpm": 10, "tpm": 900, "name": "to change"},
    ).json()
    path = f"/console/api/keys/{made['prefix']}"
    changed = owner.patch(
        path, {"rpm": 30, "tpm": None, "models": ["echo-1"], "monthly_limit": "0.5"}
    )
    assert changed.status_code == 200, changed.text
    key = changed.json()
    assert (key["rpm"], key["tpm"], key["models"], key["monthly_limit"]) == (
        30,
        None,
        ["echo-1"],
        "0.500000",
    )
    assert key["name"] == "to change"
    assert gateway.cli("keys", "list", "--project", funded["id"])["data"][0]["rpm"] == 30
    for body, param in (
        ({"tpm": 0}, "tpm"),
        ({"rpm": "many"}, "rpm"),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"monthly_limit": "-1"}, "monthly_limit"),
        ({"scopes": ["agents"]}, "scopes"),
    ):
        refused = owner.patch(path, body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, body
    assert member.patch(path, {"rpm": 5}).status_code == 404  # not their project
    assert owner.post(path + "/revoke").status_code == 200
    assert owner.patch(path, {"rpm": 5}).status_code == 409
