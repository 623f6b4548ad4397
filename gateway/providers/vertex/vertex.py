"""Vertex AI's Gemini (`kind = "vertex"`): Gemini's generateContent on a project's path,
`{base_url}/v1/projects/{project}/locations/{location}/publishers/google/models/{upstream}`,
with an OAuth2 bearer token.

The token comes from google-auth: the service-account key named by `credentials_file`
(its assertion exchanged at the file's own `token_uri`), or, with nothing named, the
application default credentials. google-auth blocks, so loading and refreshing run in a
worker thread, one at a time; the token is used until shortly before it expires
(google-auth's `valid`). No credentials found: 503, nothing sent. The token endpoint
refusing the assertion: credentials rejected (a fallback trigger).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING
from urllib.parse import quote

import aiohttp
import anyio.to_thread
import google.auth
import urllib3
from google.auth.credentials import Credentials
from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError
from google.auth.transport.urllib3 import Request
from google.oauth2 import service_account

from model_gateway.gateway.config import ProviderConfig
from model_gateway.gateway.providers.gemini.gemini import GenerateContentProvider
from model_gateway.gateway.providers.upstream import UpstreamFailure, unreachable
from model_gateway.pipeline.errors import ServiceUnavailable

if TYPE_CHECKING:
    from model_gateway.pipeline.errors import GatewayError

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
# The token endpoint (or the metadata server) gets this long; google-auth's own retries
# come on top.
_TOKEN_TIMEOUT = urllib3.Timeout(connect=10.0, read=30.0)
# How long "no application default credentials" stands before they are looked for again:
# a lookup may wait seconds for a metadata server that is not there.
_LOOKUP_AGAIN_S = 60.0


class VertexProvider(GenerateContentProvider):
    kind = "vertex"

    def __init__(self, name: str, config: ProviderConfig) -> None:
        super().__init__(name, config)
        self._credentials: Credentials | None = None
        self._lock = asyncio.Lock()  # one load or refresh at a time
        self._none_found_at: float | None = None  # when the default chain found nothing
        self._pool: urllib3.PoolManager | None = None
        self._transport: Request | None = None

    # google-auth's functions are untyped: their calls carry `type: ignore[no-untyped-call]`.

    def credential_problem(self) -> str | None:
        if self.config.credentials_file is not None:
            return None  # a named file is the config's to check (not_ready_because)
        try:
            google.auth.default(scopes=SCOPES)
        except DefaultCredentialsError:
            return (
                "no Google application default credentials: name credentials_file, or set "
                "GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login`"
            )
        return None

    async def start(self) -> None:
        await super().start()
        # No retries or redirects of urllib3's own: google-auth retries the token request.
        self._pool = urllib3.PoolManager(timeout=_TOKEN_TIMEOUT, retries=False)
        self._transport = Request(self._pool)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await super().close()
        if self._pool is not None:
            self._pool.clear()
        self._pool = self._transport = None

    def model_path(self, model: str, method: str) -> str:
        project = quote(self.config.project or "", safe="")
        location = quote(self.config.location, safe="")
        return (
            f"/v1/projects/{project}/locations/{location}/publishers/google/models/"
            f"{quote(model, safe='')}:{method}"
        )

    async def signed_headers(self, url: str, data: bytes) -> dict[str, str]:
        credentials = self._credentials
        if credentials is None or not credentials.valid:
            credentials = await self._refreshed()
        headers = self.headers()
        # authorization (and a quota project's header, if any)
        credentials.apply(headers)  # type: ignore[no-untyped-call]
        return headers

    async def failure(self, response: aiohttp.ClientResponse) -> GatewayError:
        if response.status == 401 and self._credentials is not None:
            self._credentials.token = None  # revoked before its time: the next gets a new one
        return await super().failure(response)

    async def _refreshed(self) -> Credentials:
        async with self._lock:
            if self._credentials is None:
                self._credentials = await anyio.to_thread.run_sync(self._load)
            credentials = self._credentials
            if not credentials.valid:
                try:
                    await anyio.to_thread.run_sync(credentials.refresh, self._transport)
                except RefreshError as exc:
                    # The endpoint answered: a refusal, or (retryable) its own failure.
                    reason = "server_error" if exc.retryable else "credentials_rejected"
                    raise UpstreamFailure(reason, detail="token endpoint refused") from None
                except TransportError as exc:
                    raise unreachable(self.name, exc) from None
            return credentials

    def _load(self) -> Credentials:
        """The credentials named, else the default chain's (in a worker thread)."""
        path = self.config.credentials_file
        if path is not None:
            try:
                loaded = service_account.Credentials.from_service_account_file
                return loaded(path, scopes=SCOPES)  # type: ignore[no-any-return,no-untyped-call]
            except (OSError, ValueError):  # google-auth's MalformedError is a ValueError
                raise ServiceUnavailable(
                    "The provider's credentials_file is not a service-account key."
                ) from None
        found_at = self._none_found_at
        if found_at is not None and time.monotonic() - found_at < _LOOKUP_AGAIN_S:
            raise _none_found()
        try:
            credentials, _ = google.auth.default(scopes=SCOPES, request=self._transport)
        except DefaultCredentialsError:
            self._none_found_at = time.monotonic()
            raise _none_found() from None
        return credentials


def _none_found() -> ServiceUnavailable:
    return ServiceUnavailable("No Google credentials were found for this provider.")
