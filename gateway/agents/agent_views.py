"""Agents, runs and steps as JSON (amounts as decimal strings, times RFC 3339 UTC), and
the console's request bodies decoded (400 invalid_request with `param`, as on /v1)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from model_gateway.gateway.metering.money import format_amount, parse_amount
from model_gateway.pipeline.errors import InvalidRequest
from model_gateway.pipeline.validation import decoder
from model_gateway.storage.base import AgentRecord, RunRecord, StepRecord


def _time(seconds: int | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


class AgentRequest(msgspec.Struct, kw_only=True):
    """POST /console/api/projects/{id}/agents: `AgentEngine.create_agent(project_id,
    **msgspec.structs.asdict(request))`."""

    name: str
    model: str
    instructions: str = ""
    tools: list[str] = []
    sandbox_id: str | None = None
    max_steps: int = 8


class RunRequest(msgspec.Struct, kw_only=True):
    """POST /console/api/agents/{id}/runs; `budget_micros` for `AgentEngine.start_run`."""

    input: str
    budget: str | int | float

    @property
    def budget_micros(self) -> int:
        return parse_budget(self.budget)


decode_agent_request = decoder(AgentRequest)
decode_run_request = decoder(RunRequest)


def parse_budget(value: object) -> int:
    """A run budget from the wire ("0.50" or 0.5) in micro-units (400 invalid_request)."""
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise InvalidRequest("The budget must be a decimal string.", param="budget")
    try:
        return parse_amount(value)
    except ValueError as exc:
        raise InvalidRequest(f"The budget is invalid: {exc}.", param="budget") from None


def agent_view(agent: AgentRecord) -> dict[str, Any]:
    return {
        "id": agent.id,
        "object": "agent",
        "project_id": agent.project_id,
        "name": agent.name,
        "model": agent.model,
        "instructions": agent.instructions,
        "tools": agent.tools,
        "sandbox_id": agent.sandbox_id,
        "max_steps": agent.max_steps,
        "created_at": _time(agent.created_at),
    }


def step_view(step: StepRecord) -> dict[str, Any]:
    """decisions.md's step: kind, model or runtime, tokens, duration, cost, receipt, error;
    and its transcript (agents/transcript.py; null for a step recorded without one)."""
    return {
        "kind": step.kind,
        "model" if step.kind == "model" else "runtime": step.subject,
        "input_tokens": step.input_tokens,
        "output_tokens": step.output_tokens,
        "duration_ms": step.duration_ms,
        "cost": format_amount(step.cost),
        "receipt_id": step.receipt_id,
        "error": step.error,
        "transcript": step.transcript,
    }


def run_view(run: RunRecord, steps: list[StepRecord]) -> dict[str, Any]:
    return {
        "id": run.id,
        "object": "agent.run",
        "agent_id": run.agent_id,
        "project_id": run.project_id,
        "status": run.status,
        "input": run.input,
        "budget": format_amount(run.budget),
        "spent": format_amount(run.spent),
        "steps": [step_view(step) for step in steps],
        "output": run.output,
        "error": run.error,
        "cancel_requested": run.cancel_requested,
        "created_at": _time(run.created_at),
        "finished_at": _time(run.finished_at),
    }
