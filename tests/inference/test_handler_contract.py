"""The handlers' contract with metering, in process: the real handlers and providers (echo,
and the OpenAI provider against the fake upstream), driven by hand as dispatch drives them.

`ctx.billing` must be set when the response's last
message goes out (settle acts then), and must describe exactly the bytes sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

from model_gateway.gateway.config import parse_config
from model_gateway.gateway.inference.handlers import InferenceHandlers
from model_gateway.gateway.inference.tokens import estimate_tokens
from model_gateway.gateway.providers import Providers
from model_gateway.pipeline.context import STATE_KEY, RequestContext
from model_gateway.pipeline.dispatch import Dispatch
from model_gateway.pipeline.errors import ProviderError
from tests.support.fake_upstream import (
    BROKEN_USAGE_MODES,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    REPLY_PIECES,
)
from tests.support.inference import OPENAI_CREDENTIAL

PROMPT = "Count me in."


@pytest.fixture
async def handlers(fake_openai, monkeypatch):
    monkeypatch.setenv("FAKE_OPENAI_KEY", OPENAI_CREDENTIAL)
    config = parse_config(
        f"""
[providers.local]
kind = "echo"
[providers.fakeai]
kind = "openai"
base_url = "{fake_openai.url}/v1"
api_key_env = "FAKE_OPENAI_KEY"
[models."echo-1"]
provider = "local"
[models."hang"]
provider = "fakeai"
upstream = "hang-stream"
[models."broken"]
provider = "fakeai"
upstream = "fault-500"
"""
        + "".join(
            f'[models."{mode}"]\nprovider = "fakeai"\nupstream = "{mode}"\n'
            for mode in ["normal", *BROKEN_USAGE_MODES]
        )
    )
    providers = Providers(config)
    await providers.start()
    yield InferenceHandlers(providers, timeout_s=10), config
    await providers.close()


def context(handlers, path: str, body: bytes) -> tuple[RequestContext, object]:
    inference, config = handlers
    endpoint = next(ep for ep in inference.routes() if ep.path == path)
    ctx = RequestContext("req_contract", endpoint=endpoint, body=body)
    ctx.payload = endpoint.decode(body)
    ctx.model_id = ctx.payload.model
    ctx.model = config.models[ctx.model_id]
    return ctx, endpoint.handler


class Client:
    """The ASGI side of one response: records what was sent, and what ctx said at its end."""

    def __init__(self, ctx: RequestContext, leave_after: bytes | None = None) -> None:
        self.ctx = ctx
        self.leave_after = leave_after  # disconnect once the body holds this
        self.gone = asyncio.Event()
        self.body = b""
        self.at_end: tuple | None = None

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            return
        self.body += message.get("body", b"")
        if not message.get("more_body", False):
            billing = self.ctx.billing
            assert billing is not None
            self.at_end = (billing.outcome, billing.usage, billing.response_sha256)
        if self.leave_after and self.leave_after in self.body:
            self.gone.set()

    async def run(self, response) -> None:
        await response(self.scope(), self.receive, self.send)

    async def run_dispatch(self) -> None:
        """The handler and its response as the dispatch stage runs them: it is what
        notices a client that leaves."""
        await Dispatch()(self.scope(), self.receive, self.send)

    def scope(self) -> dict:
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "state": {STATE_KEY: self.ctx},
        }


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_fields_are_set_by_the_last_message_and_match_the_bytes(handlers, path, stream):
    request = (
        f'{{"model":"echo-1","stream":{str(stream).lower()},'
        + (
            f'"messages":[{{"role":"user","content":"{PROMPT}"}}]}}'
            if path.endswith("completions")
            else f'"input":"{PROMPT}"}}'
        )
    ).encode()
    ctx, handler = context(handlers, path, request)
    response = await handler(ctx)
    client = Client(ctx)
    await client.run(response)
    outcome, usage, digest = client.at_end
    assert outcome == "succeeded"
    assert usage == {
        "input_tokens": estimate_tokens(PROMPT),
        "output_tokens": estimate_tokens(PROMPT),
    }
    assert digest == hashlib.sha256(client.body).hexdigest()
    media = dict(client.start["headers"])[b"content-type"]
    assert media.startswith(b"text/event-stream" if stream else b"application/json")


async def test_client_gone_mid_stream_closes_upstream_and_bills_what_was_sent(
    handlers, fake_openai
):
    fake_openai.disconnected.pop("hang-stream", None)
    body = b'{"model":"hang","stream":true,"messages":[{"role":"user","content":"x"}]}'
    ctx, _ = context(handlers, "/v1/chat/completions", body)
    client = Client(ctx, leave_after=b'" from"')
    started = time.monotonic()
    await asyncio.wait_for(client.run_dispatch(), 5)
    assert time.monotonic() - started < 2  # not the upstream's hour, nor the gateway timeout
    deadline = time.monotonic() + 2
    while "hang-stream" not in fake_openai.disconnected and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert "hang-stream" in fake_openai.disconnected, "the upstream connection stayed open"
    delivered = "".join(REPLY_PIECES[:2])
    assert ctx.billing is not None
    # The client left once the upstream had accepted: the prompt and what it was sent.
    assert ctx.billing.outcome == "cancelled"
    assert ctx.billing.usage == {
        "input_tokens": estimate_tokens("x"),
        "output_tokens": estimate_tokens(delivered),
    }
    assert ctx.billing.usage_source == "gateway"
    assert ctx.billing.response_sha256 == hashlib.sha256(client.body).hexdigest()


async def test_stream_failing_before_its_first_byte_raises_and_bills_nothing(handlers):
    body = b'{"model":"broken","stream":true,"messages":[{"role":"user","content":"x"}]}'
    ctx, handler = context(handlers, "/v1/chat/completions", body)
    with pytest.raises(ProviderError):
        await handler(ctx)
    assert ctx.billing is None


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("mode", ["normal", *BROKEN_USAGE_MODES])
async def test_billing_says_who_counted_the_tokens(handlers, path, stream, mode):
    """`usage_source` (for the receipt): the upstream, unless its usage was no count."""
    fields = f'"model":"{mode}","stream":{str(stream).lower()}'
    if path.endswith("completions"):
        request = f'{{{fields},"messages":[{{"role":"user","content":"{PROMPT}"}}]}}'
    else:
        request = f'{{{fields},"input":"{PROMPT}"}}'
    ctx, handler = context(handlers, path, request.encode())
    await Client(ctx).run(await handler(ctx))
    assert ctx.billing is not None and ctx.billing.outcome == "succeeded"
    if mode == "normal":
        assert ctx.billing.usage_source == "provider"
        assert ctx.billing.usage == {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS}
    else:
        assert ctx.billing.usage_source == "gateway"
        assert ctx.billing.usage == {
            "input_tokens": estimate_tokens(PROMPT),
            "output_tokens": estimate_tokens("".join(REPLY_PIECES)),
        }
