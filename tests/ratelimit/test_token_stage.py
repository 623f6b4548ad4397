"""The rate-limit stage's tokens per minute, in process: what a request weighs, that it
takes its weight from its key's and project's tpm buckets with its rpm ones (all or none),
and gives back what its billing says it did not use before the client has the last byte.
The limiter is the real in-process one on a clock the test holds still; the stand-in for
the rest of the chain bills what the test says."""

from __future__ import annotations

import orjson

from model_gateway.gateway.access import keys
from model_gateway.gateway.inference.schemas import ChatRequest
from model_gateway.gateway.metering.pricing import InferencePricing
from model_gateway.pipeline.context import Billing, RequestContext
from model_gateway.pipeline.endpoint import Endpoint
from model_gateway.pipeline.errors import ServiceUnavailable, send_error
from model_gateway.pipeline.gcra import Gcra
from model_gateway.pipeline.memory import Model
from model_gateway.pipeline.rate_limit import RateLimit, token_estimate
from model_gateway.pipeline.request_id import RequestId
from model_gateway.pipeline.validation import decoder
from model_gateway.storage.base import KeyRecord, ProjectRecord
from tests.support.asgi import WithContext, call
from tests.support.errors import assert_error


async def _handler(ctx):
    raise AssertionError("not called")


CHAT = Endpoint("POST", "/v1/chat/completions", "inference", _handler, pricing=InferencePricing())
FREE = Endpoint("GET", "/v1/models/{model_id}", "any", _handler)
MODEL = Model(max_output_tokens=1000)
EMBEDDER = Model(mode="embedding", max_output_tokens=1000)


def chat_body(max_tokens: int | None = None, text: str = "hi") -> bytes:
    body: dict = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return orjson.dumps(body)


BODY = chat_body(100)
WEIGHT = -(-len(BODY) // 4) + 100  # what a request of BODY takes


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000  # milliseconds, held still unless a test moves it

    def __call__(self) -> int:
        return self.now


class Billed:
    """The rest of the chain: bills `used` tokens (None: nothing billed) and answers."""

    def __init__(self, used: int | None, status: int = 200) -> None:
        self.used, self.status, self.calls = used, status, 0

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        ctx = scope["state"]["gateway.ctx"]
        if self.used is None:
            await send_error(send, ServiceUnavailable("upstream down"), ctx.request_id)
            return
        ctx.billing = Billing("succeeded", {"input_tokens": 1, "output_tokens": self.used - 1})
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def key(tpm=None, rpm=None, id_="key_1") -> KeyRecord:
    return KeyRecord(
        id=id_,
        prefix="proj_live_" + id_[-8:].rjust(8, "x"),
        key_hash=b"h",
        project_id="prj_1",
        scopes=keys.parse_scopes("inference"),
        rpm=rpm,
        tpm=tpm,
    )


def project(tpm=None, rpm=None) -> ProjectRecord:
    return ProjectRecord(id="prj_1", name="p", rpm=rpm, tpm=tpm)


def app_for(limiter, inner, key_, project_, body=BODY, endpoint=CHAT, model=MODEL):
    stage = RateLimit(inner, limiter=limiter, default_key_rpm=10**6, default_project_rpm=10**6)
    return RequestId(
        WithContext(
            stage,
            endpoint=endpoint,
            key=key_,
            project=project_,
            body=body,
            payload=decoder(ChatRequest)(body),
            model=model,
        )
    )


def test_a_chat_request_weighs_its_body_in_tokens_and_its_output_limit():
    def weight(body: bytes, endpoint=CHAT, model=MODEL) -> int:
        ctx = RequestContext("req_1", endpoint=endpoint, body=body, model=model)
        ctx.payload = decoder(ChatRequest)(body)
        return token_estimate(ctx)

    assert weight(chat_body(100)) == -(-len(chat_body(100)) // 4) + 100
    assert weight(chat_body(5000)) == -(-len(chat_body(5000)) // 4) + 1000  # the model's max
    assert weight(chat_body()) == -(-len(chat_body()) // 4) + 1000  # none: the model's
    assert weight(chat_body(100), model=EMBEDDER) == -(-len(chat_body(100)) // 4)  # no output
    assert weight(chat_body(100), endpoint=FREE) == 0  # nothing billed: no tokens counted
    assert weight(chat_body(100), model=None) == 0


async def test_unused_tokens_come_back_and_the_next_requests_pass():
    limiter, inner = Gcra(Clock()), Billed(used=2)
    app = app_for(limiter, inner, key(tpm=2 * WEIGHT), project())
    for _ in range(10):  # without the give-back, the third would wait
        assert (await call(app, "POST")).status_code == 200
    assert inner.calls == 10


async def test_a_key_with_tpm_admits_its_budget_then_429_with_retry_after():
    clock = Clock()
    limiter, inner = Gcra(clock), Billed(used=WEIGHT)  # every token it took was used
    wrapped = app_for(limiter, inner, key(tpm=2 * WEIGHT), project())
    for _ in range(2):
        assert (await call(wrapped, "POST")).status_code == 200
    refused = await call(wrapped, "POST")
    error = assert_error(refused, 429, "rate_limit_exceeded")
    assert int(refused.headers["retry-after"]) == error["retry_after_seconds"] >= 1
    assert wrapped.app.last.rate_limited == "tpm"
    assert inner.calls == 2
    clock.now += error["retry_after_seconds"] * 1000
    assert (await call(wrapped, "POST")).status_code == 200


async def test_a_project_with_tpm_limits_all_its_keys():
    limiter, inner = Gcra(Clock()), Billed(used=WEIGHT)
    shared = project(tpm=2 * WEIGHT)
    a = app_for(limiter, inner, key(id_="key_aaaaaaaa"), shared)
    b = app_for(limiter, inner, key(id_="key_bbbbbbbb"), shared)
    assert (await call(a, "POST")).status_code == 200
    assert (await call(b, "POST")).status_code == 200
    assert_error(await call(a, "POST"), 429, "rate_limit_exceeded")
    assert_error(await call(b, "POST"), 429, "rate_limit_exceeded")


async def test_a_request_refused_for_tokens_takes_no_request_from_rpm():
    limiter, inner = Gcra(Clock()), Billed(used=WEIGHT)
    tight = app_for(limiter, inner, key(tpm=WEIGHT, rpm=3), project())
    assert (await call(tight, "POST")).status_code == 200
    for _ in range(5):
        assert_error(await call(tight, "POST"), 429, "rate_limit_exceeded")
    # The refusals cost the key's rpm nothing: two of its three remain.
    untimed = app_for(limiter, inner, key(rpm=3), project())
    assert (await call(untimed, "POST")).status_code == 200
    assert (await call(untimed, "POST")).status_code == 200
    refused = app_for(limiter, inner, key(rpm=3), project())
    assert_error(await call(refused, "POST"), 429, "rate_limit_exceeded")
    assert refused.app.last.rate_limited == "rpm"


async def test_a_request_that_ran_nothing_gives_every_token_back():
    limiter, inner = Gcra(Clock()), Billed(used=None)  # e.g. the upstream was down: 503
    app = app_for(limiter, inner, key(tpm=WEIGHT), project())
    for _ in range(5):
        assert (await call(app, "POST")).status_code == 503
    assert inner.calls == 5


async def test_tokens_come_back_before_the_client_has_the_last_byte():
    limiter, inner = Gcra(Clock()), Billed(used=2)
    app = app_for(limiter, inner, key(tpm=WEIGHT), project())
    seen_at_the_last_byte = []

    async def client(scope, receive, send):
        async def watching(message):
            if message["type"] == "http.response.body":
                bucket = [("tpm:key_1", WEIGHT, WEIGHT - 2)]
                seen_at_the_last_byte.append(limiter.take(bucket).wait_s)
                limiter.give(bucket)
            await send(message)

        await app(scope, receive, watching)

    assert (await call(client, "POST")).status_code == 200
    assert seen_at_the_last_byte == [0]  # all but the 2 used were back already


async def test_tokens_used_beyond_the_estimate_are_taken_too():
    clock = Clock()
    limiter, inner = Gcra(clock), Billed(used=WEIGHT + 60)  # 60 more than it took
    app = app_for(limiter, inner, key(tpm=WEIGHT), project())
    assert (await call(app, "POST")).status_code == 200
    clock.now += 60_000  # a minute gives back WEIGHT tokens: 60 are still owed
    refused = await call(app, "POST")
    assert_error(refused, 429, "rate_limit_exceeded")
    clock.now += -(-60 * 60_000 // WEIGHT)
    assert (await call(app, "POST")).status_code == 200


async def test_a_request_above_a_whole_minute_takes_the_whole_minute():
    clock = Clock()
    limiter, inner = Gcra(clock), Billed(used=2)
    small = WEIGHT // 2  # the request weighs twice the key's minute
    app = app_for(limiter, inner, key(tpm=small), project())
    assert (await call(app, "POST")).status_code == 200  # a full bucket: it passes
    clock.now += 1  # 2 tokens used stay owed until they refill
    refused = await call(app, "POST")
    assert 1 <= assert_error(refused, 429, "rate_limit_exceeded")["retry_after_seconds"] <= 60
    clock.now += 60_000
    assert (await call(app, "POST")).status_code == 200


async def test_requests_that_weigh_nothing_pass_a_spent_token_bucket():
    limiter, inner = Gcra(Clock()), Billed(used=WEIGHT)
    spent = key(tpm=WEIGHT)
    assert (await call(app_for(limiter, inner, spent, project()), "POST")).status_code == 200
    assert_error(
        await call(app_for(limiter, inner, spent, project()), "POST"), 429, "rate_limit_exceeded"
    )
    free = app_for(limiter, inner, spent, project(), endpoint=FREE)
    assert (await call(free, "POST")).status_code == 200
