"""A project's sandbox configurations and playground."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import Response

from model_gateway.gateway.console.call import PAGE, Call, route
from model_gateway.gateway.console.guard import project_of
from model_gateway.gateway.console.html import (
    api_form,
    esc,
    field,
    project_page,
    table,
)
from model_gateway.pipeline.endpoint import Endpoint

if TYPE_CHECKING:
    from model_gateway.gateway.catalog import ConfigCatalog
    from model_gateway.gateway.console.mount import Console
    from model_gateway.storage.base import ProjectRecord

_P = "/console/projects/{project_id}"


def model_options(catalog: ConfigCatalog, project: ProjectRecord) -> str:
    """The models the project may use, as <option>s; unavailable ones shown disabled."""
    return "".join(
        f'<option value="{esc(mid)}">{esc(mid)}</option>'
        if catalog.available(model)
        else f'<option value="{esc(mid)}" disabled>{esc(mid)} (unavailable)</option>'
        for mid, model in catalog.visible_to(None, project)
    )


def routes(console: Console) -> list[Endpoint]:
    storage, catalog = console.storage, console.gateway.catalog

    async def sandboxes(call: Call) -> Response:
        project = await project_of(storage, call)
        rows = [
            [
                f"<code>{esc(s.id)}</code>",
                esc(s.runtime),
                esc(s.timeout_s),
                esc(s.memory_mb),
            ]
            for s in await storage.list_sandboxes(project.id)
        ]
        body = table(
            ["ID", "Runtime", "Time limit (s)", "Memory (MB)"],
            rows,
            empty="No sandbox configuration yet.",
        )
        if project.state == "active":
            runtimes = "".join(f"<option>{r}</option>" for r in ("python", "node", "bash"))
            body += "<h2>New sandbox configuration</h2>" + api_form(
                f"/console/api/projects/{project.id}/sandboxes",
                f'<label>Runtime<select name="runtime">{runtimes}</select></label>'
                + field(
                    "Time limit (s)", "timeout_s", kind="number", value="10", extra="min=1 data-int"
                )
                + field(
                    "Memory (MB)", "memory_mb", kind="number", value="256", extra="min=1 data-int"
                ),
                "Create sandbox",
            )
        return project_page("Sandboxes", project, "sandboxes", body, user=call.user)

    async def playground(call: Call) -> Response:
        project = await project_of(storage, call)
        options = model_options(catalog, project)
        if project.state != "active":
            body = '<p class="note">The project is archived: the playground is closed.</p>'
        else:
            body = (
                '<p class="note">Calls run with the project\'s full scope and are billed and '
                "receipted like any API call. The conversation stays on this page: each turn "
                "sends the exchanges before it.</p>"
                "<h2>Conversation</h2>"
                '<ol id="conversation" class="conversation" aria-live="polite">'
                '<li class="empty" id="conversation-empty">No message yet.</li></ol>'
                f'<form class="card" id="playground" data-project="{esc(project.id)}">'
                f'<label>Model<select name="model" aria-label="Model">{options}</select></label>'
                + field(
                    "Max tokens",
                    "max_tokens",
                    kind="number",
                    extra='min="1" step="1" placeholder="empty: the model\'s maximum"',
                )
                + field(
                    "Temperature",
                    "temperature",
                    kind="number",
                    extra='min="0" max="2" step="0.1" placeholder="empty: the model\'s default"',
                )
                + '<label class="wide">System<textarea name="system" rows="2" data-raw'
                ' placeholder="Instructions sent first at every turn (optional)"></textarea>'
                "</label>"
                '<label class="wide">Message<textarea name="message" rows="3" required>'
                "Say hello to the console.</textarea></label>"
                '<label class="check"><input type="checkbox" name="stream" checked> Stream</label>'
                '<div class="actions"><button type="submit">Send</button>'
                ' <button type="button" class="secondary" data-clear-conversation>'
                "Clear conversation</button></div>"
                '<p class="form-error" role="alert" hidden></p></form>'
                '<h2>Receipt of the last call</h2><div id="receipt" class="card receipt">'
                '<p class="note">The receipt of each call appears here.</p></div>'
            )
        return project_page("Playground", project, "playground", body, user=call.user)

    return [
        route("GET", _P + "/sandboxes", PAGE, sandboxes),
        route("GET", _P + "/playground", PAGE, playground),
    ]
