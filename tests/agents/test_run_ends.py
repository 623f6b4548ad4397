"""Every run ends: whatever form the model's answer takes, and whatever storage refuses.

A model on an OpenAI-compatible upstream may answer its text as content parts
(`[{"type": "text", "text": ...}]`): the run's output is that text, and the run ends. And
should storage ever refuse a run's end, the run is failed instead, logged once, and the
sweeper goes on failing the runs of dead instances.
"""

from __future__ import annotations

import asyncio
import logging

from model_gateway.storage.base import AgentRecord, RunRecord, now_s
from tests.agents.support import micros
from tests.console.agents_support import start_run, wait_run
from tests.console.support import ConsoleClient, create_user
from tests.support.fake_openai import WHOLE_PARTS, FakeOpenAI
from tests.support.fake_upstream import REPLY
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import OPENAI_CREDENTIAL, UPSTREAM_ENV, _model


def _upstream(url: str) -> str:
    return f"""
[providers.fakeai]
kind = "openai"
base_url = "{url}/v1"
api_key_env = "FAKE_OPENAI_KEY"
{_model("parts", "fakeai", WHOLE_PARTS)}
[agents]
lease_s = 3
"""


def test_a_run_whose_model_answers_content_parts_completes_with_their_text(tmp_path):
    with (
        FakeOpenAI(OPENAI_CREDENTIAL) as fake,
        GatewayProcess(tmp_path, extra_config=_upstream(fake.url), env=UPSTREAM_ENV) as gw,
    ):
        create_user(gw, "owner@example.com")
        client = ConsoleClient(gw)
        assert client.login("owner@example.com").status_code == 200
        project = client.post("/console/api/projects", {"name": "parts"}).json()["id"]
        paid = client.post(
            f"/console/api/projects/{project}/payments", {"amount": "1", "reference": "parts"}
        )
        assert paid.status_code == 201, paid.text
        agent = client.post(
            f"/console/api/projects/{project}/agents", {"name": "parts", "model": "parts"}
        )
        assert agent.status_code == 201, agent.text
        agent_id = agent.json()["id"]
        run = start_run(client, agent_id, "Say hello.", "0.10")
        ended = wait_run(client, agent_id, run["id"], timeout=15)
        assert ended["status"] == "completed", ended
        assert ended["output"] == REPLY and ended["error"] is None
        [step] = ended["steps"]
        assert step["kind"] == "model" and step["receipt_id"] and step["error"] is None
        # An ended run cannot be cancelled: 409, not a 200 that changes nothing.
        cancel = client.post(f"/console/api/agents/{agent_id}/runs/{run['id']}/cancel")
        assert cancel.status_code == 409, cancel.text
        client.close()
    assert "could not be ended" not in gw.log() and "sweep failed" not in gw.log()


async def test_a_run_whose_end_storage_refuses_fails_and_the_sweeper_goes_on(make_gateway, caplog):
    gw = await make_gateway(lease_s=1.5)
    project = await gw.project("1.00")
    agent = await gw.storage.create_agent(
        AgentRecord(id="agt_ends", project_id=project, name="a", model="echo-1")
    )

    def run(run_id: str, owner: str) -> RunRecord:
        return RunRecord(
            id=run_id,
            agent_id=agent.id,
            project_id=project,
            input="x",
            budget=micros("0.10"),
            owner=owner,
            lease_until=now_s() + 1,
        )

    refused = await gw.storage.create_run(run("run_refused", gw.engine.owner))
    elsewhere = await gw.storage.create_run(run("run_elsewhere", "elsewhere:1:1"))
    caplog.set_level(logging.WARNING, logger="gateway.agents")
    # An end storage cannot take (a list where the output's text belongs: what a model's
    # content parts were, before they became text).
    await gw.engine._finish(refused.id, "completed", [{"type": "text", "text": "hi"}], None)
    ended = await gw.storage.get_run(refused.id)
    assert ended.status == "failed" and ended.error["type"] == "internal_error"
    assert ended.output is None
    # The sweeper keeps sweeping: a dead instance's run fails once its lease expires.
    ended = await asyncio.wait_for(gw.engine.wait(elsewhere.id), 10)
    assert ended.status == "failed" and "lease" in ended.error["message"]
    logged = [r for r in caplog.records if "run_refused" in r.getMessage()]
    assert len(logged) == 1 and "sweep failed" not in caplog.text
    await gw.check_books(project, micros("1.00"), [refused, elsewhere])
