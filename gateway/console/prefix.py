"""The console under a mount prefix (a host app's `Mount("/llm", app=gateway)`).

Pages, redirects, the session cookie and the script name absolute `/console/...` paths
(and `/proofs/...` for receipts). Under a prefix they must name `<prefix>/console/...`:
rather than threading the prefix through every page, the console's responses are
rewritten once on the way out, and only when there is a prefix (the common, unmounted
case pays nothing).
"""

from __future__ import annotations

from starlette.types import Message, Send

# Every such path in a page is a quoted attribute value.
_ATTRIBUTES = (b'"/console', b'"/proofs/')


def under_prefix(root: str, send: Send) -> Send:
    prefix = root.encode("latin-1")
    start: Message | None = None

    async def rewritten(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            headers = [(name, _header(name, value, prefix)) for name, value in message["headers"]]
            message = {**message, "headers": headers}
            if _is_html(headers):
                start = message  # sent with the body, whose length changes
                return
        elif message["type"] == "http.response.body" and start is not None:
            body = message.get("body", b"")
            for attribute in _ATTRIBUTES:
                body = body.replace(attribute, b'"' + prefix + attribute[1:])
            headers = [(n, v) for n, v in start["headers"] if n != b"content-length"]
            if not message.get("more_body", False):
                headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            start = None
            message = {**message, "body": body}
        await send(message)

    return rewritten


def _header(name: bytes, value: bytes, prefix: bytes) -> bytes:
    if name == b"location" and value.startswith(b"/console"):
        return prefix + value
    if name == b"set-cookie":
        return value.replace(b"Path=/console", b"Path=" + prefix + b"/console")
    return value


def _is_html(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(n == b"content-type" and v.startswith(b"text/html") for n, v in headers)
