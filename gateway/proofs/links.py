"""Where links to the gateway's own public paths start.

Never from the request: a Host header is whatever the client wrote, and a page or receipt
that echoes it lets anyone mint a copy of our proof page that points elsewhere (a forged
`gateway verify` command, links to a look-alike deployment). The operator's
`[server] public_url` gives absolute links; without it, links are path-absolute on this
server, behind the mount prefix (`root_path`) when the gateway is embedded under one. The
root path comes from the ASGI server or the host app's Mount, never from a header.
"""

from __future__ import annotations

from starlette.types import Scope


def link_base(public_url: str | None, scope: Scope) -> str:
    """The prefix of the gateway's paths: "https://gw.example.com/llm", "/llm" or ""."""
    if public_url:
        return public_url.rstrip("/")
    root_path: str = scope.get("root_path", "")
    return root_path.rstrip("/")


def is_absolute(base: str) -> bool:
    return base.startswith(("http://", "https://"))
