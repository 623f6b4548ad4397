"""AWS Bedrock Runtime's Converse API, spoken to the gateway as Chat Completions.

`{base_url}/model/{model id}/converse` and `/converse-stream`, every request signed with
Signature V4 (service `bedrock`) by botocore over the exact path and bytes sent. The
credentials are the named variables' (`access_key_env`, `secret_key_env`, optional
`session_token_env`), read per request; when none is named, botocore's default credential
chain, found once at start (off the event loop) and frozen per request, which refreshes
temporary ones. No credentials: 503, nothing sent. The stream is AWS's event-stream
framing (decoded by botocore). The translation itself is in `converse_translate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import (  # type: ignore[import-untyped]
    Credentials,
    RefreshableCredentials,
)
from botocore.eventstream import EventStreamBuffer  # type: ignore[import-untyped]
from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]
from botocore.session import get_session  # type: ignore[import-untyped]
from yarl import URL

from model_gateway.gateway.config import ProviderConfig
from model_gateway.gateway.providers.bedrock.converse_translate import (
    ConverseAnswer,
    ConverseChunks,
    ConverseEvent,
    chat_completion,
    converse_request,
)
from model_gateway.gateway.providers.shapes import checked
from model_gateway.gateway.providers.upstream import (
    Acceptance,
    HttpProvider,
    UpstreamFailure,
    drained,
    malformed,
    parse_json,
    reported_error,
    stream_ended_early,
)
from model_gateway.pipeline.errors import GatewayError, ServiceUnavailable

if TYPE_CHECKING:
    import aiohttp

    from model_gateway.gateway.inference.json_types import JSONObject

log = logging.getLogger("gateway.providers")

# The shortest event-stream message: prelude (12 bytes), no headers, no payload, its CRC.
_MIN_MESSAGE = 16


def _default_credentials() -> Any:
    """botocore's default chain (environment, shared files, SSO, container, instance
    metadata...): blocking, so run in a thread. None when it finds nothing."""
    return get_session().get_credentials()


def _no_credentials(why: str) -> ServiceUnavailable:
    return ServiceUnavailable(f"The model's provider has no AWS credentials ({why}).")


class BedrockProvider(HttpProvider):
    kind = "bedrock"
    native_responses = False

    def __init__(self, name: str, config: ProviderConfig) -> None:
        super().__init__(name, config)
        self.region = config.region or ""
        self.chain: Any = None  # the default chain's credentials (none named)

    def credential_problem(self) -> str | None:
        if self.config.access_key_env is not None or _default_credentials() is not None:
            return None  # named variables are the config's to check (not_ready_because)
        return (
            "botocore's default credential chain found no AWS credentials: name "
            "access_key_env and secret_key_env, or set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, a profile in ~/.aws, or an instance role"
        )

    async def start(self) -> None:
        await super().start()
        if self.config.access_key_env is not None:
            return
        try:
            self.chain = await asyncio.to_thread(_default_credentials)
        except BotoCoreError as exc:  # a broken profile, say: the class name only
            log.warning(
                "provider %s: AWS credential chain failed (%s)", self.name, type(exc).__name__
            )
        if self.chain is None:
            log.warning("provider %s: no AWS credentials found; its requests are 503", self.name)

    async def _credentials(self) -> Any:
        """This request's credentials (access key, secret key, token)."""
        config = self.config
        if config.access_key_env is not None and config.secret_key_env is not None:
            named = [config.access_key_env, config.secret_key_env]
            if config.session_token_env is not None:
                named.append(config.session_token_env)
            values = [os.environ.get(variable) for variable in named]
            for variable, value in zip(named, values, strict=True):
                if not value:
                    raise _no_credentials(f"{variable} is not set")
            return Credentials(*values)
        chain = self.chain
        if chain is None:
            raise _no_credentials("the default credential chain found none")
        if isinstance(chain, RefreshableCredentials) and chain.refresh_needed():
            try:  # a refresh calls out (STS, SSO, instance metadata): not on the loop
                return await asyncio.to_thread(chain.get_frozen_credentials)
            except (BotoCoreError, ClientError) as exc:  # STS refused, say
                raise UpstreamFailure("credentials_rejected", detail=type(exc).__name__) from None
        return chain.get_frozen_credentials()

    async def signed_headers(self, url: str, data: bytes) -> dict[str, str]:
        credentials = await self._credentials()
        # Signed as aiohttp sends it: yarl normalizes the path (%3A goes as ':').
        sent = str(URL(url))
        headers = {**self.config.headers, "content-type": "application/json"}
        request = AWSRequest(method="POST", url=sent, data=data, headers=headers)
        SigV4Auth(credentials, "bedrock", self.region).add_auth(request)
        return dict(request.headers.items())

    async def failure(self, response: aiohttp.ClientResponse) -> GatewayError:
        if response.status == 424:  # ModelErrorException: the model failed, not the request
            return UpstreamFailure("server_error", detail="HTTP 424")
        return await super().failure(response)

    @staticmethod
    def _path(model: str, operation: str) -> str:
        # A model id holds ':' and may be an ARN (with '/'): one path segment.
        return f"/model/{quote(model, safe='')}/{operation}"

    async def chat(self, request: JSONObject, acceptance: Acceptance) -> JSONObject:
        path = self._path(request["model"], "converse")
        answer = await self.post_json(path, converse_request(request), acceptance)
        return chat_completion(checked(self.name, answer, ConverseAnswer), request["model"])

    async def chat_stream(
        self, request: JSONObject, acceptance: Acceptance
    ) -> AsyncGenerator[JSONObject]:
        path = self._path(request["model"], "converse-stream")
        translator = ConverseChunks(request["model"])
        frames = EventStreamBuffer()
        reads = self.post_stream(path, converse_request(request), acceptance)
        async with contextlib.aclosing(reads):
            async for read in reads:
                frames.add_data(read)
                for event_type, payload in self._events(frames):
                    for chunk in translator.feed(event_type, payload):
                        yield chunk
                    if translator.done:
                        break
                if translator.done:
                    await drained(reads)
                    break
        if not translator.done:
            raise stream_ended_early(self.name)

    def _events(self, frames: Any) -> Iterator[tuple[str | None, JSONObject]]:
        """The complete messages in `frames` as (event type, checked payload)."""
        while True:
            try:
                message = next(frames, None)
            except Exception:  # a CRC that fails, or framing no parser should trust
                raise malformed(self.name) from None
            if message is None:
                return
            if message.prelude.total_length < _MIN_MESSAGE:
                raise malformed(self.name)  # would not move the buffer on
            headers = message.headers
            if headers.get(":message-type") != "event":
                # An exception (throttling, model stream error...): its text is not read.
                raise reported_error(self.name)
            payload = checked(self.name, parse_json(self.name, message.payload), ConverseEvent)
            yield headers.get(":event-type"), payload
