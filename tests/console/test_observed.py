"""Console activity is observed like /v1 traffic: one access line per request in the
configured format (with the signed-in user's email; never a password, session id or key)
and the requests metric, for sign-ins (failed ones too), pages, keys and agent runs. The
playground, which is the /v1 chain, is observed once."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.console.agents_support import start_run, wait_run
from tests.console.support import PASSWORD, ConsoleClient, create_user
from tests.operations.test_metrics import samples, value
from tests.support.gateway_process import GatewayProcess
from tests.support.http import chat_body

EMAIL = "watched@example.com"
WRONG = "a wrong password 5be1c9 that must never be logged"


def _lines(gw: GatewayProcess, request_id: str) -> list[str]:
    """The log's lines naming the request (access lines are flushed within 0.25 s)."""
    deadline = time.monotonic() + 5
    while True:
        found = [line for line in gw.log().splitlines() if request_id in line]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_every_console_request_has_one_access_line_and_counts(tmp_path, log_format):
    gw = GatewayProcess(tmp_path, server_extra=f'log_format = "{log_format}"').start()
    try:
        create_user(gw, EMAIL)
        client = ConsoleClient(gw)
        answers = {}  # what was done -> (response, the user its line names)
        answers["failed sign-in"] = (client.login(EMAIL, WRONG), None)
        answers["sign-in"] = (client.login(EMAIL), EMAIL)
        session = client.session
        answers["page"] = (client.get("/console/projects"), EMAIL)
        project = client.post("/console/api/projects", {"name": "watched"})
        answers["project"] = (project, EMAIL)
        pid = project.json()["id"]
        client.post(f"/console/api/projects/{pid}/payments", {"amount": "1", "reference": "w"})
        key = client.post(f"/console/api/projects/{pid}/keys", {"scopes": ["inference"]})
        answers["key"] = (key, EMAIL)
        revoked = client.post(f"/console/api/keys/{key.json()['prefix']}/revoke")
        answers["revoke"] = (revoked, EMAIL)
        agent = client.post(
            f"/console/api/projects/{pid}/agents", {"name": "w", "model": "echo-1"}
        ).json()
        run = start_run(client, agent["id"], "hello", "0.10")
        assert wait_run(client, agent["id"], run["id"])["status"] == "completed"
        answers["run"] = (client.get(f"/console/api/agents/{agent['id']}/runs/{run['id']}"), EMAIL)
        play = client.post(f"/console/api/projects/{pid}/playground/chat/completions", chat_body())
        answers["playground"] = (play, EMAIL)
        # No route: answered before the session is read, so no user either.
        answers["missing"] = (client.get("/console/api/nothing-here"), None)
        form = httpx.post(gw.url + "/console/login", data={"email": EMAIL, "password": PASSWORD})
        answers["form sign-in"] = (form, EMAIL)
        metrics = httpx.get(gw.url + "/metrics").text
        client.close()
    finally:
        gw.stop()
    log = gw.log()
    assert WRONG not in log and PASSWORD not in log
    assert session not in log and key.json()["key"] not in log
    for what, (response, user) in answers.items():
        [line] = _lines(gw, response.headers["x-request-id"])  # one line, in the format
        path = response.request.url.path
        if log_format == "json":
            entry = json.loads(line)
            assert entry["logger"] == "gateway.access", what
            assert entry["status"] == response.status_code, what
            assert entry["user"] == user, what
        else:
            assert f" {response.status_code} " in line, what
            assert (f"user={user}" in line) == (user is not None), (what, line)
        assert ("/v1/chat/completions" if what == "playground" else path) in line, what

    found = samples(metrics)

    def requests(endpoint: str, method: str, status: int) -> float:
        labels = {"endpoint": endpoint, "method": method, "status": str(status)}
        return value(found, "gateway_requests_total", **labels)

    assert requests("/console/api/login", "POST", 401) == 1
    assert requests("/console/api/login", "POST", 200) == 1
    assert requests("/console/login", "POST", 303) == 1
    assert requests("/console/projects", "GET", 200) == 1
    assert requests("/console/api/projects/{project_id}/keys", "POST", 201) == 1
    assert requests("/console/api/keys/{prefix}/revoke", "POST", 200) == 1
    assert requests("/console/api/agents/{agent_id}/runs", "POST", 201) == 1
    assert requests("/v1/chat/completions", "POST", 200) == 1  # the playground, once
    assert requests("unmatched", "GET", 404) == 1
    assert pid not in metrics  # labels are templates, never raw paths
