"""The console's HTML: one layout, escaped values, no inline script or style (strict CSP)."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from starlette.responses import HTMLResponse

from model_gateway.gateway.metering.money import MICROS_PER_UNIT, parse_amount

if TYPE_CHECKING:
    from model_gateway.storage.base import ProjectRecord, UserRecord

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "cache-control": "no-store",
    "referrer-policy": "same-origin",
    "x-content-type-options": "nosniff",
}

TABS = [
    ("", "Overview"),
    ("keys", "Keys"),
    ("usage", "Usage"),
    ("receipts", "Receipts"),
    ("ledger", "Ledger"),
    ("sandboxes", "Sandboxes"),
    ("playground", "Playground"),
    ("agents", "Agents"),
]


def esc(value: object) -> str:
    return "" if value is None else escape(str(value), quote=True)


def page(
    title: str, body: str, *, user: UserRecord | None = None, status: int = 200
) -> HTMLResponse:
    account = ""
    if user is not None:
        account = (
            f'<span class="who">{esc(user.email)} · {esc(user.role)}</span>'
            '<button type="button" class="link" data-logout>Sign out</button>'
        )
    html = f"""<!doctype html>
<html lang="en" data-console="/console"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · Gateway console</title>
<link rel="icon" href="/console/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/console/static/console.css">
<script src="/console/static/console.js" defer></script>
</head><body>
<header class="bar"><a class="brand" href="/console/projects">Model Gateway</a>
<nav>{'<a href="/console/projects">Projects</a>' if user else ""}\
{'<a href="/console/audit">Audit log</a>' if user and user.role == "owner" else ""}</nav>
<div class="account">{account}</div></header>
<main>{body}</main>
</body></html>"""
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def project_page(
    title: str, project: ProjectRecord, tab: str, body: str, *, user: UserRecord | None
) -> HTMLResponse:
    links = "".join(
        f'<a href="/console/projects/{esc(project.id)}{"/" + slug if slug else ""}"'
        f"{' aria-current=page' if slug == tab else ''}>{label}</a>"
        for slug, label in TABS
    )
    state = '<span class="badge">archived</span>' if project.state != "active" else ""
    head = (
        f'<p class="crumbs"><a href="/console/projects">Projects</a> /</p>'
        f'<h1>{esc(project.name)} {state}</h1><p class="id">{esc(project.id)}</p>'
        f'<nav class="tabs">{links}</nav>'
    )
    return page(f"{title} · {project.name}", head + body, user=user)


def table(headers: list[str], rows: list[list[str]], *, empty: str = "Nothing yet.") -> str:
    """`rows` hold HTML already escaped by the caller."""
    if not rows:
        return f'<p class="empty">{esc(empty)}</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f'<td data-label="{esc(h)}">{c}</td>' for h, c in zip(headers, row, strict=True))
        + "</tr>"
        for row in rows
    )
    table_html = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="scroll">{table_html}</div>'


def facts(pairs: list[tuple[str, str]]) -> str:
    """A definition list; values are HTML already escaped by the caller."""
    items = "".join(f"<div><dt>{esc(k)}</dt><dd>{v}</dd></div>" for k, v in pairs)
    return f'<dl class="facts">{items}</dl>'


def field(label: str, name: str, *, kind: str = "text", value: str = "", extra: str = "") -> str:
    return (
        f'<label>{esc(label)}<input name="{esc(name)}" type="{kind}" value="{esc(value)}"'
        f" {extra}></label>"
    )


def short_time(iso_time: str | None) -> str:
    return esc((iso_time or "").replace("T", " ")[:16])


def usd(micros: int) -> str:
    """An amount as people read it: `$0.0012`, `$5.00`, `$1,250.50`, `-$0.000001`. Exact:
    integer micro-units, trailing zeros dropped down to cents, never a float."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS_PER_UNIT)
    cents = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"{sign}${whole:,}.{cents}"


def usd_text(value: str) -> str:
    """A decimal string of the API (`"0.001200"`) as `usd` shows it."""
    return usd(parse_amount(value, at_most=None))


def amount_html(value: str | None, empty: str = "none") -> str:
    """A decimal amount string of the API, with its currency (`$0.0012`)."""
    if value is None:
        return esc(empty)
    return f'<span class="num">{esc(usd_text(value))}</span>'


def key_link(prefix: str) -> str:
    return f'<a href="/console/keys/{esc(prefix)}"><code>{esc(prefix)}</code></a>'


def older_link(path: str, cursor: str | None, query: dict[str, str] | None = None) -> str:
    """The link to the next page; `query` carries a list's filters along."""
    if cursor is None:
        return ""
    href = f"{path}?{urlencode({**(query or {}), 'cursor': cursor})}"
    return f'<p class="more"><a href="{esc(href)}">Older entries</a></p>'


def api_form(api: str, inner: str, button: str, *, method: str = "POST", extra: str = "") -> str:
    return (
        f'<form class="card" data-api="{esc(api)}" data-method="{method}" {extra}>{inner}'
        f'<div class="actions"><button type="submit">{esc(button)}</button></div>'
        '<p class="form-error" role="alert" hidden></p></form>'
    )
