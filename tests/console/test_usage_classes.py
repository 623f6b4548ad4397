"""Cached tokens and their savings in the usage report: the console's JSON and page, and
`gateway usage` (the same report from the CLI), over a real gateway in front of a fake
OpenAI upstream whose `cached` mode reports cache reads and reasoning."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime

import httpx
import pytest

from tests.console.support import create_user
from tests.support.fake_openai import CACHED, CACHED_READS, REASONING, FakeOpenAI
from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS
from tests.support.gateway_process import GATEWAY, GatewayProcess
from tests.support.http import bearer, chat_body
from tests.support.inference import OPENAI_CREDENTIAL

# Cache reads at 0.30 instead of 3.00 USD per MTok: each request's 4 save 10.8 micro-units,
# two save 21.6, rounded down once for the group: 21 (per request: 20 down, 22 up).
MODELS = """
[models."cache-model"]
provider = "fake"
upstream = "cached"
input_price_per_mtok = "3.00"
cached_input_price_per_mtok = "0.30"
output_price_per_mtok = "15.00"
max_output_tokens = 64

[models."plain-model"]
provider = "fake"
upstream = "normal"
input_price_per_mtok = "3.00"
output_price_per_mtok = "15.00"
max_output_tokens = 64
"""
SAVED_BY_TWO = "0.000021"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """Overrides the console's gateway: this one bills cache reads below the input price."""
    with FakeOpenAI(OPENAI_CREDENTIAL) as fake:
        assert CACHED == "cached"  # the upstream name MODELS gives the cache model
        block, env = fake.provider_config("fake")
        process = GatewayProcess(
            tmp_path_factory.mktemp("usage-classes"), extra_config=block + MODELS, env=env
        )
        with process:
            create_user(process, "owner@example.com")
            yield process


@pytest.fixture(scope="module")
def used(gateway) -> str:
    """A project that made two requests with cache reads and one without."""
    project = gateway.create_project("cache", "--balance", "5")
    key = gateway.create_key(project)
    for model in ("cache-model", "cache-model", "plain-model"):
        answer = httpx.post(
            gateway.url + "/v1/chat/completions",
            json=chat_body(model=model, max_tokens=16),
            headers=bearer(key),
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
    return project


def cli_usage(gateway: GatewayProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [GATEWAY, "usage", *args, "--config", str(gateway.config_path)],
        capture_output=True,
        text=True,
        env=gateway.env,
        timeout=60,
    )


def test_the_usage_json_sums_the_classes_and_the_savings(owner, used):
    report = owner.get(f"/console/api/projects/{used}/usage", params={"group_by": "model"})
    assert report.status_code == 200, report.text
    rows = {row["group"]: row for row in report.json()["data"]}
    cached = rows["cache-model"]
    assert (cached["requests"], cached["input_tokens"], cached["output_tokens"]) == (
        2,
        2 * INPUT_TOKENS,
        2 * OUTPUT_TOKENS,
    )
    assert (
        cached["cached_input_tokens"],
        cached["cache_write_tokens"],
        cached["reasoning_tokens"],
    ) == (2 * CACHED_READS, 0, 2 * REASONING)
    assert cached["cache_savings"] == SAVED_BY_TWO
    plain = rows["plain-model"]
    assert (plain["cached_input_tokens"], plain["reasoning_tokens"]) == (0, 0)
    assert plain["cache_savings"] == "0.000000"
    total = report.json()["total"]
    assert (total["cached_input_tokens"], total["cache_savings"]) == (8, SAVED_BY_TWO)
    by_day = owner.get(f"/console/api/projects/{used}/usage").json()
    assert [row["cache_savings"] for row in by_day["data"]] == [SAVED_BY_TWO]


def test_the_usage_page_shows_cached_tokens_and_savings(owner, used):
    page = owner.get(f"/console/projects/{used}/usage")
    assert page.status_code == 200
    per_model = page.text.split("<h2>Per model</h2>")[1].split("<h2>")[0]
    headings = re.findall(r"<th>([^<]*)</th>", per_model)
    assert headings[:4] == ["Model", "Requests", "Input tokens", "Cached"]
    assert "Cache savings" in headings
    row = per_model.split("<code>cache-model</code>")[1].split("</tr>")[0]
    assert f'<td data-label="Cached">{2 * CACHED_READS}</td>' in row
    assert 'data-label="Cache savings"><span class="num">$0.000021</span>' in row
    assert "<dt>Cache savings</dt>" in page.text


def test_the_cli_prints_the_consoles_report(gateway, owner, used):
    for params in ({}, {"group_by": "model"}, {"group_by": "key"}):
        console = owner.get(f"/console/api/projects/{used}/usage", params=params).json()
        flags = [f"--group-by={params['group_by']}"] if params else []
        done = cli_usage(gateway, "--project", used, *flags, "--json")
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("\n") == 1 and json.loads(done.stdout) == console
    today = datetime.now(UTC).date().isoformat()
    ranged = cli_usage(gateway, "--project", used, "--from", today, "--to", today, "--json")
    assert [row["group"] for row in json.loads(ranged.stdout)["data"]] == [today]
    empty = cli_usage(gateway, "--project", used, "--from", "2020-01-01", "--to", "2020-01-31")
    assert empty.returncode == 0 and "total" in empty.stdout


def test_the_cli_shows_the_report_as_a_table(gateway, used):
    done = cli_usage(gateway, "--project", used, "--group-by", "model")
    assert done.returncode == 0, done.stderr
    title, head, *rows = done.stdout.splitlines()
    assert "by model" in title and "USD" in title
    assert head.split() == [
        "model", "requests", "input", "cached", "cache", "writes", "output", "reasoning",
        "sandbox", "s", "cost", "cache", "savings",
    ]  # fmt: skip
    cells = {row.split()[0]: row.split() for row in rows}
    assert set(cells) == {"cache-model", "plain-model", "total"}
    assert cells["cache-model"][1:4] == ["2", str(2 * INPUT_TOKENS), str(2 * CACHED_READS)]
    assert cells["cache-model"][-1] == cells["total"][-1] == SAVED_BY_TWO
    # The last column is right-aligned: every line is as wide as the heading.
    assert {len(line) for line in rows} == {len(head)}


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--from", "yesterday"], "--from"),
        (["--to", "2026-02-30"], "--to"),
        (["--group-by", "colour"], "--group-by"),
        (["--from", "2026-02-02", "--to", "2026-02-01"], "--to"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(gateway, used, flags, named):
    done = cli_usage(gateway, "--project", used, *flags, "--json")
    assert done.returncode == 1 and done.stderr.startswith("gateway: " + named)
    error = json.loads(done.stdout)["error"]
    assert error["type"] == "invalid_request" and error["message"].startswith(named)
    plain = cli_usage(gateway, "--project", used, *flags)
    assert plain.returncode == 1 and plain.stdout == ""


def test_an_unknown_project_is_not_found(gateway):
    done = cli_usage(gateway, "--project", "prj_0123456789abcdef", "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"]["type"] == "not_found"
