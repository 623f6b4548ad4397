"""Settle, alone: a whole response's head goes out with its settled body; a stream's
head goes out at once, and the stream is settled at its end."""

from __future__ import annotations

from model_gateway.pipeline.context import STATE_KEY, Billing, RequestContext
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.hold import Hold
from model_gateway.pipeline.memory import MemoryMeter, Project
from model_gateway.pipeline.settle import Settle


class FlatPricing:
    kind = "inference"
    priced = 0  # how many times `cost` ran, over every instance

    def subject(self, ctx: RequestContext) -> str:
        return "m"

    def estimate(self, ctx: RequestContext) -> int:
        return 500

    def cost(self, ctx: RequestContext) -> int:
        FlatPricing.priced += 1
        return 200


async def answer(ctx: RequestContext):
    raise AssertionError("the tests send their responses themselves")


def responder(messages: list[dict]):
    """The inner app: reports billing, then sends `messages` as a handler's response."""

    async def inner(scope, receive, send):
        scope["state"][STATE_KEY].billing = Billing("succeeded", {"output_tokens": 2})
        for message in messages:
            await send(message)

    return inner


async def run(messages: list[dict]) -> tuple[MemoryMeter, list[tuple[str, int]]]:
    """Settle over `messages`; what reached the client, each with the receipts by then."""
    meter = MemoryMeter({"p": Project("p", balance=1_000)}, {})
    ctx = RequestContext("req_1", Endpoint("POST", "/v1/x", "any", answer, pricing=FlatPricing()))
    ctx.hold = await Hold.take(meter, "p", None, 500)
    ctx.receipt_id = "rcpt_1"
    sent: list[tuple[str, int]] = []

    async def client(message: dict) -> None:
        sent.append((message["type"], len(meter.receipts)))

    scope = {"type": "http", "state": {STATE_KEY: ctx}}
    await Settle(responder(messages))(scope, None, client)
    return meter, sent


def start(*headers: tuple[bytes, bytes]) -> dict:
    return {"type": "http.response.start", "status": 200, "headers": list(headers)}


async def test_a_whole_response_starts_only_once_settled():
    meter, sent = await run(
        [start((b"content-length", b"2")), {"type": "http.response.body", "body": b"{}"}]
    )
    assert sent == [("http.response.start", 1), ("http.response.body", 1)]
    assert meter.projects["p"].balance == 800


async def test_a_streams_head_goes_at_once_and_its_end_is_settled():
    chunk = {"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True}
    meter, sent = await run([start(), chunk, {"type": "http.response.body", "body": b""}])
    assert sent == [
        ("http.response.start", 0),
        ("http.response.body", 0),
        ("http.response.body", 1),
    ]
    assert meter.projects["p"].balance == 800


async def test_a_request_is_priced_once_however_its_response_ends():
    """Once the final body settled the request, the stage's settlement after the handler
    returns builds nothing again (it ran on every request, for nothing)."""
    body = {"type": "http.response.body", "body": b"{}"}
    for messages in ([start((b"content-length", b"2")), body], [start(), body], []):
        before = FlatPricing.priced
        meter, _ = await run(messages)
        assert FlatPricing.priced - before == 1, messages
        assert len(meter.receipts) == 1 and meter.projects["p"].balance == 800
