"""/v1/messages against real upstreams: an Anthropic upstream gets the client's body as it
came and its answers and streams pass byte for byte (but the model's name and an in-band
error); other upstreams get the neutral chat request, none of Anthropic's own fields, and
never refuse them. Receipts are exact and bill all input, while answers show usage in
Anthropic's convention; failures after the stream started are Anthropic's `error` event;
an Anthropic stream stops at the held output."""

from __future__ import annotations

import time

import anthropic
import httpx
import orjson
import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens, messages_prompt_text
from tests.metering.billing import books, micros
from tests.support.errors import assert_error
from tests.support.fake_anthropic import CACHE_READS, CACHE_WRITES, LONG_PIECES
from tests.support.fake_openai import CACHED_READS
from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, SECRET
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import (
    ANTHROPIC_CREDENTIAL,
    NO_BREAKER,
    UPSTREAM_ENV,
    _model,
    inference_config,
    read_sse,
)

INPUT_PRICE, OUTPUT_PRICE = 500_000, 1_500_000  # micro-units per million tokens (_model)
MORE_MODELS = [("an/cache", "fakeanthropic", "cache"), ("oa/cached", "fakeai", "cached")]
MORE_MODELS += [(f"an/{mode}", "fakeanthropic", mode) for mode in ("stream-error", "long")]
STALL = "stall-after-accept"  # the first event, then nothing until the gateway hangs up
MORE_MODELS += [("an/" + STALL, "fakeanthropic", STALL), ("oa/" + STALL, "fakeai", STALL)]
BETA = "prompt-caching-2024-07-31,token-efficient-tools-2025-02-19"
# What the gateway does not read: Anthropic upstreams get it as it came, others never.
FOREIGN = ("cache_control", "thinking", "top_k", "container", "future_field", "search_result")


def _rich(model: str, marker: str, **extra) -> dict:
    """A Messages body with every kind of field the gateway does not read."""
    return {
        "model": model,
        "max_tokens": 1_000_000,  # above the model's 4096: clamped, never refused
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": marker}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Hmm.", "signature": "c2ln"},
                    {"type": "text", "text": "Go on."},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "search_result", "source": "s", "title": "t", "content": []},
                    {"type": "text", "text": "More.", "cache_control": {"type": "ephemeral"}},
                ],
            },
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "top_k": 5,
        "temperature": 0.5,
        "metadata": {"user_id": "user-7"},
        "container": "container_1",
        "future_field": {"nested": [1, 2.5, None]},
        **extra,
    }


@pytest.fixture(scope="module")
def gw(tmp_path_factory, fake_openai, fake_anthropic):
    config = inference_config(fake_openai.url, fake_anthropic.url) + NO_BREAKER
    config += "".join(_model(*model) for model in MORE_MODELS)
    folder = tmp_path_factory.mktemp("messages-upstreams")
    with GatewayProcess(folder, extra_config=config, env=UPSTREAM_ENV) as process:
        yield process


@pytest.fixture(scope="module")
def project(gw) -> str:
    return gw.create_project("messages", "--balance", "100")


@pytest.fixture(scope="module")
def key(gw, project) -> str:
    return gw.create_key(project, "inference,receipts")


@pytest.fixture(scope="module")
def http(gw, key):
    with httpx.Client(base_url=gw.url, headers={"x-api-key": key}, timeout=20) as client:
        yield client


def _receipt(http: httpx.Client, response: httpx.Response) -> dict:
    found = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}")
    assert found.status_code == 200, found.text
    return found.json()


def _events(response: httpx.Response) -> list[tuple[str | None, dict]]:
    return [(name, orjson.loads(data)) for name, data in read_sse(response.content)]


def _stream_usage(events: list[tuple[str | None, dict]]) -> dict:
    """The usage a client reads off a stream: message_start's, updated by message_delta's."""
    usage = dict(events[0][1]["message"]["usage"])
    usage.update(next(p for name, p in events if name == "message_delta")["usage"])
    return usage


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_anthropic_upstream_gets_the_body_as_it_came(http, fake_anthropic, stream):
    marker = f"marker-as-it-came-{stream}"
    body = _rich("an/normal", marker, stream=stream)
    response = http.post("/v1/messages", json=body, headers={"anthropic-beta": BETA})
    assert response.status_code == 200, response.text
    [sent] = fake_anthropic.sent(marker=marker)
    assert sent.body == {**body, "model": "normal", "max_tokens": 4096}
    assert list(sent.body) == list(body)  # in the client's order too
    assert sent.headers["anthropic-beta"] == BETA
    assert sent.headers["x-api-key"] == ANTHROPIC_CREDENTIAL  # the gateway's, not the client's


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_anthropic_answer_passes_byte_for_byte_but_the_model(http, fake_anthropic, stream):
    body = {"model": "an/normal", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    if stream:
        body["stream"] = True
    response = http.post("/v1/messages", json=body)
    assert response.status_code == 200
    direct = httpx.post(
        fake_anthropic.url + "/v1/messages",
        json={**body, "model": "normal"},
        headers={"x-api-key": ANTHROPIC_CREDENTIAL, "anthropic-version": "2023-06-01"},
    )
    expected = direct.content.replace(b'"model":"normal"', b'"model":"an/normal"')
    assert b'"model":"an/normal"' in expected
    assert response.content == expected


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_translated_upstreams_get_none_of_anthropics_fields_and_never_refuse_them(
    http, fake_openai, stream
):
    marker = f"marker-translated-{stream}"
    response = http.post(
        "/v1/messages",
        json=_rich("oa/normal", marker, stream=stream),
        headers={"anthropic-beta": BETA},
    )
    assert response.status_code == 200, response.text
    [sent] = fake_openai.sent(marker=marker)
    assert "anthropic-beta" not in sent.headers
    raw = orjson.dumps(sent.body).decode()
    assert not [field for field in FOREIGN if field in raw]
    assert sent.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": marker},
        {"role": "assistant", "content": "Go on."},
        {"role": "user", "content": "More."},
    ]
    assert sent.body["max_completion_tokens"] == 4096
    assert (sent.body["temperature"], sent.body["user"]) == (0.5, "user-7")


MODELS = ["echo-1", "oa/normal", "an/normal"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("model", MODELS)
def test_receipts_are_exact(gw, project, http, model, stream):
    body = {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "Hi!"}]}
    before = books(gw, project)
    response = http.post("/v1/messages", json={**body, "stream": stream})
    assert response.status_code == 200
    if stream:
        usage = _stream_usage(_events(response))
    else:
        usage = response.json()["usage"]
    if model == "echo-1":
        expected = (estimate_tokens(messages_prompt_text(body)), estimate_tokens("Hi!"))
    else:
        expected = (INPUT_TOKENS, OUTPUT_TOKENS)
    assert (usage["input_tokens"], usage["output_tokens"]) == expected
    receipt = _receipt(http, response)
    assert receipt["status"] == "succeeded" and receipt["endpoint"] == "/v1/messages"
    assert receipt["model"] == model
    assert (receipt["usage"]["input_tokens"], receipt["usage"]["output_tokens"]) == expected
    cost = _cost(expected[0], expected[1])
    assert micros(receipt["cost"]) == cost
    after = books(gw, project)
    assert before["balance"] - after["balance"] == cost and after["reserved"] == 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("model", ["an/cache", "oa/cached"])
def test_usage_in_anthropics_convention_while_the_receipt_bills_all_input(http, model, stream):
    body = {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    response = http.post("/v1/messages", json={**body, "stream": stream})
    assert response.status_code == 200
    usage = _stream_usage(_events(response)) if stream else response.json()["usage"]
    if model == "an/cache":  # Anthropic reports it so: passed as it came
        shown = (INPUT_TOKENS, CACHE_READS, CACHE_WRITES)
        billed_input = INPUT_TOKENS + CACHE_READS + CACHE_WRITES
    else:  # chat's prompt_tokens holds the cache reads: shown apart
        shown = (INPUT_TOKENS - CACHED_READS, CACHED_READS, 0)
        billed_input = INPUT_TOKENS
    cache = (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"])
    assert (usage["input_tokens"], *cache) == shown
    assert usage["output_tokens"] == OUTPUT_TOKENS
    receipt = _receipt(http, response)
    assert receipt["usage"]["input_tokens"] == billed_input
    cost = _cost(billed_input, OUTPUT_TOKENS)
    assert micros(receipt["cost"]) == cost


def _cost(input_tokens: int, output_tokens: int) -> int:
    """At the test model's prices (one price for every input class), rounded up once."""
    return -(-(input_tokens * INPUT_PRICE + output_tokens * OUTPUT_PRICE) // 10**6)


def _assert_error_event(response: httpx.Response, events: list) -> None:
    name, payload = events[-1]
    assert name == "error"
    assert payload == {
        "type": "error",
        "error": {
            "type": "provider_error",
            "message": payload["error"]["message"],
            "request_id": response.headers["x-request-id"],
        },
    }


def test_an_in_band_error_is_rewritten_to_the_specs_error(http):
    body = {"model": "an/stream-error", "max_tokens": 64, "stream": True}
    response = http.post(
        "/v1/messages", json={**body, "messages": [{"role": "user", "content": "Hi"}]}
    )
    assert response.status_code == 200
    assert SECRET.encode() not in response.content
    assert b"overloaded_error" not in response.content
    events = _events(response)
    _assert_error_event(response, events)
    texts = [p["delta"]["text"] for name, p in events if name == "content_block_delta"]
    assert texts == ["Hello", " from"]  # what came before it passed
    receipt = _receipt(http, response)
    assert receipt["status"] == "failed"
    assert receipt["usage"]["output_tokens"] == estimate_tokens("Hello from")


@pytest.mark.parametrize("model", ["an/cut-mid-stream", "oa/cut-mid-stream", "an/stream-error"])
def test_a_failure_after_the_stream_started_is_anthropics_error_event(gw, key, model):
    client = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=20)
    received = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        with client.messages.stream(
            model=model, max_tokens=64, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            received += stream.text_stream
    assert received, "the error came before any output: not an in-band error"
    error = caught.value.body["error"]
    assert error["type"] == "provider_error" and error["request_id"].startswith("req_")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("model", "status", "kind"),
    [
        ("an/fault-500", 502, "provider_error"),
        ("an/fault-400", 400, "invalid_request"),
        ("oa/fault-500", 502, "provider_error"),
    ],
)
def test_errors_before_the_stream_are_the_specs_error_object(http, model, status, kind, stream):
    body = {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    response = http.post("/v1/messages", json={**body, "stream": stream})
    assert_error(response, status, kind)
    assert SECRET not in response.text
    assert "x-receipt-id" not in response.headers


def test_an_anthropic_stream_stops_at_the_held_output(gw, project, http):
    limit = 16
    held = -(-limit * 5 // 4) + 16  # decisions.md: the limit x 1.25, rounded up, + 16
    body = {"model": "an/long", "max_tokens": limit, "stream": True}
    before = books(gw, project)
    response = http.post(
        "/v1/messages", json={**body, "messages": [{"role": "user", "content": "Go"}]}
    )
    assert response.status_code == 200
    events = _events(response)
    _assert_error_event(response, events)
    delivered = "".join(p["delta"]["text"] for name, p in events if name == "content_block_delta")
    assert "".join(LONG_PIECES).startswith(delivered)
    size = len(delivered.encode())
    assert held * 4 - len(LONG_PIECES[0]) < size <= held * 4  # the crossing event cut short
    receipt = _receipt(http, response)
    assert receipt["status"] == "failed"
    assert receipt["usage"]["output_tokens"] == -(-size // 4)
    cost = _cost(receipt["usage"]["input_tokens"], receipt["usage"]["output_tokens"])
    assert micros(receipt["cost"]) == cost
    after = books(gw, project)
    assert before["balance"] - after["balance"] == cost and after["reserved"] == 0


@pytest.mark.parametrize("model", MODELS)
def test_count_tokens_is_never_billed(gw, project, http, model):
    before = books(gw, project)
    body = {"model": model, "messages": [{"role": "user", "content": "Count me."}]}
    response = http.post("/v1/messages/count_tokens", json=body)
    assert response.status_code == 200
    assert set(response.json()) == {"input_tokens"}
    assert "x-receipt-id" not in response.headers
    assert books(gw, project) == before


def _wait_for(condition, what: str, timeout_s: float = 5):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return value


@pytest.mark.parametrize("provider", ["an", "oa"])
def test_a_client_that_leaves_a_stream_is_billed_as_cancelled(
    http, fake_anthropic, fake_openai, provider
):
    upstream = fake_anthropic if provider == "an" else fake_openai
    upstream.disconnected.pop(STALL, None)
    body = {"model": f"{provider}/{STALL}", "max_tokens": 64, "stream": True}
    body["messages"] = [{"role": "user", "content": "Read this, then I hang up."}]
    with http.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        receipt_id = response.headers["x-receipt-id"]
        assert b"event: message_start" in next(response.iter_raw())
    _wait_for(lambda: STALL in upstream.disconnected, "the upstream call outlived the client")

    def settled() -> dict | None:
        found = http.get(f"/v1/receipts/{receipt_id}")
        return found.json() if found.status_code == 200 else None

    receipt = _wait_for(settled, "no receipt for the cancel")
    assert receipt["status"] == "cancelled"
    # Anthropic's message_start said the input; a chat stream says nothing before its end.
    prompt = INPUT_TOKENS if provider == "an" else estimate_tokens(messages_prompt_text(body))
    assert (receipt["usage"]["input_tokens"], receipt["usage"]["output_tokens"]) == (prompt, 0)
