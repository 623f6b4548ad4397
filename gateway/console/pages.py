"""The console's pages: server-rendered HTML over the same records as the JSON API.

Every action a page offers (create, revoke, archive, pay, play) is a call of the JSON API
made by the one vendored script, static/console.js; the pages themselves only read.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from starlette.responses import RedirectResponse, Response

from model_gateway.gateway.admin.admin_views import project_view
from model_gateway.gateway.console import (
    pages_agents,
    pages_project,
    pages_reports,
    pages_tools,
)
from model_gateway.gateway.console.api_session import sign_in
from model_gateway.gateway.console.call import PAGE, Call, route
from model_gateway.gateway.console.html import amount_html, api_form, esc, field, page, table
from model_gateway.gateway.console.payload import Fields
from model_gateway.pipeline.endpoint import PUBLIC, Endpoint
from model_gateway.pipeline.errors import GatewayError, NotFound

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console

_P = "/console/projects/{project_id}"
_STATIC_TYPES = {
    "console.js": "text/javascript",
    "console.css": "text/css",
    "favicon.svg": "image/svg+xml",
}


def error_page(error: GatewayError) -> Response:
    body = (
        f'<h1>{error.status}</h1><p class="error-text">{esc(error.message)}</p>'
        '<p><a href="/console/projects">Back to the projects</a></p>'
    )
    return page("Error", body, status=error.status)


def login_page(
    email: str = "", error: GatewayError | None = None, *, sso: bool = False
) -> Response:
    """The sign-in form. It posts (never a GET: the password would enter the URL) to
    POST /console/login when no script runs; the script sends it as JSON instead. With
    `sso` ([console.oidc] set), a link to single sign-on: a link, as `form-action 'self'`
    would stop a form leaving for the issuer."""
    alert = (
        '<p class="form-error" role="alert" hidden></p>'
        if error is None
        else f'<p class="form-error" role="alert">{esc(error.message)}</p>'
    )
    body = (
        '<section class="signin"><h1>Sign in</h1>'
        '<form class="card" id="login" method="post" action="/console/login"'
        ' data-api="/console/api/login" data-method="POST" data-next="/console/projects">'
        + field(
            "Email",
            "email",
            kind="email",
            value=email,
            extra='autocomplete="username" required',
        )
        + field(
            "Password",
            "password",
            kind="password",
            extra='autocomplete="current-password" required data-raw',
        )
        + '<div class="actions"><button type="submit">Sign in</button></div>'
        + alert
        + "</form>"
        + ('<p class="sso"><a href="/console/sso/start">Sign in with SSO</a></p>' if sso else "")
        + '<p class="note">Accounts are made by an operator: '
        "<code>gateway users create EMAIL --password-stdin</code>.</p></section>"
    )
    response = page("Sign in", body, status=200 if error is None else error.status)
    if error is not None and error.retry_after is not None:
        response.headers["retry-after"] = str(error.retry_after)
    return response


def routes(console: Console) -> list[Endpoint]:
    storage = console.storage
    sso = console.config.console.oidc is not None

    async def static(call: Call) -> Response:
        name = call.params["name"]
        if name not in _STATIC_TYPES:
            raise NotFound("No such file.")
        data = (resources.files("model_gateway.gateway.console") / "static" / name).read_bytes()
        return Response(
            data,
            media_type=_STATIC_TYPES[name],
            headers={"cache-control": "no-cache", "x-content-type-options": "nosniff"},
        )

    async def home(call: Call) -> Response:
        return RedirectResponse("/console/projects", status_code=303)

    async def login(call: Call) -> Response:
        return login_page(sso=sso)

    async def login_form(call: Call) -> Response:
        """The sign-in form posted without JavaScript: the JSON endpoint's sign-in, then
        303 to the console; refused, the sign-in page again with the error (and its status)."""
        form: dict[str, str] = {}
        try:
            form = await call.form()
            _, cookie = await sign_in(console, call, Fields(form))
        except GatewayError as error:
            return login_page(form.get("email", ""), error, sso=sso)
        return RedirectResponse(
            "/console/projects", status_code=303, headers={"set-cookie": cookie}
        )

    async def projects(call: Call) -> Response:
        user = call.session_user
        ids = None if user.role == "owner" else await storage.granted_projects(user.id)
        rows: list[list[str]] = []
        for record in await storage.list_projects(ids):
            p = await project_view(console.admin, record)
            rows.append(
                [
                    f'<a href="/console/projects/{esc(p["id"])}">{esc(p["name"])}</a>',
                    f"<code>{esc(p['id'])}</code>",
                    esc(p["state"]),
                    amount_html(p["balance"]),
                    amount_html(p["month_spend"]),
                    amount_html(p["monthly_budget"]),
                ]
            )
        create = ""
        if user.role == "owner":
            create = "<h2>New project</h2>" + api_form(
                "/console/api/projects",
                field("Name", "name", extra="required maxlength=200")
                + field("Monthly budget (USD)", "monthly_budget", extra='inputmode="decimal"')
                + field("Requests per minute", "rpm", kind="number", extra="min=1 data-int")
                + field("Tokens per minute", "tpm", kind="number", extra="min=1 data-int"),
                "Create project",
                extra='data-next="/console/projects/{id}"',
            )
        body = (
            "<h1>Projects</h1>"
            + table(
                ["Name", "ID", "State", "Balance", "Month spend", "Budget"],
                rows,
                empty="No project you may see yet.",
            )
            + create
        )
        return page("Projects", body, user=user)

    return [
        route("GET", "/console/static/{name}", PUBLIC, static),
        route("GET", "/console/login", PUBLIC, login),
        route("POST", "/console/login", PUBLIC, login_form),
        route("GET", "/console", PAGE, home),
        route("GET", "/console/", PAGE, home),
        route("GET", "/console/projects", PAGE, projects),
        *pages_project.routes(console),
        *pages_reports.routes(console),
        *pages_tools.routes(console),
        *pages_agents.routes(console),
    ]
