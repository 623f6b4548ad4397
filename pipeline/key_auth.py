"""Key auth: who is calling.

Reads: `authorization` (Bearer, scheme case-insensitive) or, only when that header is
absent, `x-api-key`. Query strings and cookies are never read. Writes: `ctx.key`,
`ctx.project`. Rejects: 401 invalid_api_key (no, malformed, unknown, revoked or expired
key, all with one identical message), 403 forbidden (archived project).
"""

from __future__ import annotations

from gateway.errors import GatewayError, InvalidApiKey, send_error
from gateway.keyring import KeyRing
from pipeline.context import context_of


def presented_key(headers) -> str:
    """The key from the request headers, or InvalidApiKey."""
    authorization = api_key = None
    for name, value in headers:
        if name == b"authorization":
            if authorization is not None:
                raise InvalidApiKey()  # two Authorization headers: ambiguous, so malformed
            authorization = value
        elif name == b"x-api-key" and api_key is None:
            api_key = value
    if authorization is not None:
        scheme, _, credential = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not credential.strip():
            raise InvalidApiKey()
        return credential.strip().decode("latin-1")
    if api_key is not None and api_key.strip():
        return api_key.strip().decode("latin-1")
    raise InvalidApiKey()


class KeyAuth:
    def __init__(self, app, *, keyring: KeyRing) -> None:
        self.app = app
        self.keyring = keyring

    async def __call__(self, scope, receive, send) -> None:
        ctx = context_of(scope)
        try:
            ctx.key, ctx.project = await self.keyring.authenticate(presented_key(scope["headers"]))
        except GatewayError as error:
            await send_error(send, error, ctx.request_id)
            return
        await self.app(scope, receive, send)
