"""A project's agents, one agent (its runs, a form to start one) and one run, whose steps
static/console.js streams from the run's events while it goes on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import Response

from model_gateway.gateway.agents.agent_views import agent_view, run_view
from model_gateway.gateway.console.api_agents import visible_agent, visible_run
from model_gateway.gateway.console.call import PAGE, Call, route
from model_gateway.gateway.console.guard import project_of, visible_project
from model_gateway.gateway.console.html import (
    amount_html,
    api_form,
    esc,
    facts,
    field,
    project_page,
    short_time,
    table,
)
from model_gateway.gateway.console.pages_tools import model_options
from model_gateway.gateway.console.run_html import run_body
from model_gateway.pipeline.endpoint import Endpoint

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console
    from model_gateway.storage.base import ProjectRecord, SandboxRecord


def _agent_form(project: ProjectRecord, sandboxes: list[SandboxRecord], models: str) -> str:
    choices = "".join(
        f'<option value="{esc(s.id)}">{esc(s.id)} ({esc(s.runtime)})</option>' for s in sandboxes
    )
    if not choices:
        choices = '<option value="">none yet: create one under Sandboxes</option>'
    return api_form(
        f"/console/api/projects/{project.id}/agents",
        field("Name", "name", extra="required maxlength=200")
        + f'<label>Model<select name="model">{models}</select></label>'
        + field("Max steps", "max_steps", kind="number", value="8", extra="min=1 max=100 data-int")
        + '<label class="wide">Instructions<textarea name="instructions" rows="3" data-raw>'
        "</textarea></label>"
        '<label class="check"><input type="checkbox" name="tools" value="sandbox" checked>'
        " Sandbox tool (the agent may call run_code)</label>"
        f'<label>Sandbox<select name="sandbox_id">{choices}</select></label>',
        "Create agent",
        extra='data-next="/console/agents/{id}"',
    )


def routes(console: Console) -> list[Endpoint]:
    storage, catalog = console.storage, console.gateway.catalog

    async def agents(call: Call) -> Response:
        project = await project_of(storage, call)
        rows = [
            [
                f'<a href="/console/agents/{esc(a.id)}">{esc(a.name)}</a>',
                f"<code>{esc(a.id)}</code>",
                esc(a.model),
                esc(", ".join(a.tools) or "none"),
                f"<code>{esc(a.sandbox_id or '')}</code>",
                esc(a.max_steps),
            ]
            for a in await console.gateway.agents.list_agents(project.id)
        ]
        body = table(
            ["Name", "ID", "Model", "Tools", "Sandbox", "Max steps"],
            rows,
            empty="No agent yet.",
        )
        if project.state == "active":
            sandboxes = await storage.list_sandboxes(project.id)
            body += "<h2>New agent</h2>" + _agent_form(
                project, sandboxes, model_options(catalog, project)
            )
        return project_page("Agents", project, "agents", body, user=call.user)

    async def agent(call: Call) -> Response:
        found = await visible_agent(console, call)
        project = await visible_project(storage, call.session_user, found.project_id)
        a = agent_view(found)
        body = f'<h2>Agent {esc(a["name"])}</h2><p class="id">{esc(a["id"])}</p>' + facts(
            [
                ("Model", esc(a["model"])),
                ("Tools", esc(", ".join(a["tools"]) or "none")),
                ("Sandbox", f"<code>{esc(a['sandbox_id'])}</code>" if a["sandbox_id"] else "none"),
                ("Max steps", esc(a["max_steps"])),
            ]
        )
        if a["instructions"]:
            body += f'<h3>Instructions</h3><pre class="output input">{esc(a["instructions"])}</pre>'
        if project.state == "active":
            body += "<h2>Start a run</h2>" + api_form(
                f"/console/api/agents/{found.id}/runs",
                '<label class="wide">Input<textarea name="input" rows="5" required data-raw'
                ' placeholder="A task; a fenced ```python block is code the agent may run">'
                "</textarea></label>"
                + field(
                    "Budget (USD)", "budget", value="0.50", extra='required inputmode="decimal"'
                ),
                "Start run",
                extra=f'data-next="/console/agents/{esc(found.id)}/runs/{{id}}"',
            )
        rows = [
            [
                f'<a href="/console/agents/{esc(found.id)}/runs/{esc(r.id)}">{esc(r.id)}</a>',
                esc(r.status),
                amount_html(v["spent"]),
                amount_html(v["budget"]),
                short_time(v["created_at"]),
            ]
            for r in await console.gateway.agents.list_runs(found.id)
            for v in [run_view(r, [])]
        ]
        body += "<h2>Runs</h2>" + table(
            ["Run", "Status", "Spent", "Budget", "Started"], rows, empty="No run yet."
        )
        return project_page(f"Agent {found.name}", project, "agents", body, user=call.user)

    async def run(call: Call) -> Response:
        found, record = await visible_run(console, call)
        project = await visible_project(storage, call.session_user, found.project_id)
        view = run_view(record, await console.gateway.agents.run_steps(record.id))
        link = f'<a href="/console/agents/{esc(found.id)}">{esc(found.name)}</a>'
        back = f'<p class="crumbs">{link} /</p>'
        body = back + run_body(found.id, view)
        return project_page(f"Run {record.id}", project, "agents", body, user=call.user)

    return [
        route("GET", "/console/projects/{project_id}/agents", PAGE, agents),
        route("GET", "/console/agents/{agent_id}", PAGE, agent),
        route("GET", "/console/agents/{agent_id}/runs/{run_id}", PAGE, run),
    ]
