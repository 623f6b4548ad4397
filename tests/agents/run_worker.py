"""A gateway process that starts one slow run and keeps running it until it is killed:
`python run_worker.py CONFIG PROJECT SANDBOX` prints {"run_id": ...} once the run's
sandbox step is in flight."""

from __future__ import annotations

import asyncio
import json
import sys

from model_gateway.gateway.app import open_gateway
from model_gateway.gateway.config import load_config

SLOW = "```python\nimport time\ntime.sleep(20)\n```"


async def main(config: str, project_id: str, sandbox_id: str) -> None:
    gateway = await open_gateway(load_config(config))
    agent = await gateway.agents.create_agent(
        project_id, name="victim", model="echo-1", tools=["sandbox"], sandbox_id=sandbox_id
    )
    run = await gateway.agents.start_run(agent, input=SLOW, budget=1_000_000)
    while not any(
        step.kind == "sandbox" and step.reservation_id
        for step in await gateway.storage.run_steps(run.id)
    ):
        await asyncio.sleep(0.02)
    print(json.dumps({"run_id": run.id}), flush=True)
    await asyncio.Event().wait()  # until kill -9


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
