"""The vertex kind through a real `gateway serve` in front of the fake Google: its token
endpoint verifies the service account's JWT assertion (RS256 by the key it knows, iss,
aud, scope, lifetime) and the generate endpoints take only a token it issued. Chat and
Responses, plain and streamed, with the official openai SDK; tools; usage by class;
exact receipts; failures; the token cached; a refused assertion and its fallback; a
credentials file absent; application default credentials, found and not found."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.chat_requests import PROMPT
from tests.support.chat_requests import chat as _chat
from tests.support.chat_requests import finishes as _finishes
from tests.support.chat_requests import logged as _logged
from tests.support.chat_requests import marker as _marker
from tests.support.chat_requests import stream_text as _stream_text
from tests.support.errors import assert_error
from tests.support.fake_gemini import (
    CACHED_TOKENS,
    COST,
    LOCATION,
    MODES,
    PROJECT,
    THOUGHT_SIGNATURE,
    THOUGHT_TOKENS,
    TO_ECHO,
    FakeVertex,
    model_block,
)
from tests.support.fake_upstream import (
    INPUT_TOKENS,
    MALFORMED,
    OUTPUT_TOKENS,
    REPLY,
    REPLY_PIECES,
    SECRET,
)
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import NO_BREAKER, sse_payloads

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
MODEL_PATH = f"/v1/projects/{PROJECT}/locations/{LOCATION}/publishers/google/models"


def _vertex_block(name: str, url: str, credentials: str = "") -> str:
    return f"""
[providers.{name}]
kind = "vertex"
base_url = "{url}"
project = "{PROJECT}"
location = "{LOCATION}"
{credentials}
"""


def _no_default_credentials(process: GatewayProcess, folder) -> None:
    """An environment where google-auth's default chain finds nothing, fast."""
    process.env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    process.env["CLOUDSDK_CONFIG"] = str(folder)  # an empty gcloud configuration
    process.env["NO_GCE_CHECK"] = "true"  # no metadata server to wait for


@pytest.fixture(scope="module")
def fake():
    with FakeVertex() as fake:
        yield fake


@pytest.fixture(scope="module")
def gw(tmp_path_factory, fake):
    folder = tmp_path_factory.mktemp("vertex")
    block, env = fake.provider_config("vx")
    rogue = fake.service_account_file(folder / "rogue.json", rogue=True)
    config = block + NO_BREAKER
    config += _vertex_block("vx-rogue", fake.url, f'credentials_file = "{rogue}"')
    config += _vertex_block("vx-absent", fake.url, f'credentials_file = "{folder}/absent.json"')
    config += _vertex_block("vx-default", fake.url)
    config += "".join(model_block(f"v/{mode}", "vx", mode) for mode in MODES)
    config += model_block("v/rogue", "vx-rogue", "normal")
    config += model_block("v/rogue-falls-back", "vx-rogue", "normal", TO_ECHO)
    config += model_block("v/absent", "vx-absent", "normal")
    config += model_block("v/default", "vx-default", "normal")
    config += """
[models."v/embed"]
provider = "vx"
upstream = "normal"
mode = "embedding"
input_price_per_mtok = "0.15"
"""
    process = GatewayProcess(folder, extra_config=config, env=env)
    empty = tmp_path_factory.mktemp("gcloud")
    _no_default_credentials(process, empty)
    yield process.start()
    process.stop()


# --- chat and Responses ----------------------------------------------------------------------


def test_chat_with_a_token_from_the_service_account(client, fake):
    marker = _marker()
    done = client.chat.completions.create(**_chat("v/normal", f"{PROMPT} {marker}"))
    assert done.model == "v/normal"
    assert done.choices[0].message.content == REPLY
    assert done.choices[0].finish_reason == "stop"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    [sent] = fake.sent(marker=marker)
    assert sent.path == f"{MODEL_PATH}/normal:generateContent"
    scheme, _, token = sent.headers["authorization"].partition(" ")
    assert scheme == "Bearer" and token in fake.issued  # exchanged for a verified assertion
    assert sent.body["contents"] == [{"role": "user", "parts": [{"text": f"{PROMPT} {marker}"}]}]


def test_chat_stream(client, fake):
    marker = _marker()
    chunks = list(
        client.chat.completions.create(
            **_chat("v/normal", marker), stream=True, stream_options={"include_usage": True}
        )
    )
    assert _stream_text(chunks) == REPLY
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert _finishes(chunks) == ["stop"]
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    [sent] = fake.sent(marker=marker)
    assert sent.path == f"{MODEL_PATH}/normal:streamGenerateContent"


def test_the_token_is_cached(client, fake):
    token_requests = fake.token_requests
    marker = _marker()
    for _ in range(3):
        client.chat.completions.create(**_chat("v/normal", marker))
    client.responses.create(model="v/normal", input=marker)
    assert len({r.headers["authorization"] for r in fake.sent(marker=marker)}) == 1
    assert fake.token_requests - token_requests <= 1  # the first of them, if no token yet


def test_a_401_drops_the_token(client, http, fake):
    """A token refused before its time (revoked): the next request gets a new one."""
    marker = _marker()
    client.chat.completions.create(**_chat("v/normal", marker))
    assert http.post("/v1/chat/completions", json=_chat("v/fault-401")).status_code == 502
    client.chat.completions.create(**_chat("v/normal", marker))
    first, second = (r.headers["authorization"] for r in fake.sent(marker=marker))
    assert first != second


def test_responses(client):
    response = client.responses.create(model="v/normal", input=PROMPT)
    assert response.status == "completed" and response.output_text == REPLY
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)


def test_responses_stream(client):
    events = list(client.responses.create(model="v/normal", input=PROMPT, stream=True))
    assert events[-1].type == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == REPLY and len(deltas) > 1
    assert events[-1].response.usage.output_tokens == OUTPUT_TOKENS


def test_tool_call_then_its_result(client, fake):
    marker = _marker()
    messages = [{"role": "user", "content": f"Weather in Paris? {marker}"}]
    done = client.chat.completions.create(model="v/tool-call", messages=messages, tools=[WEATHER])
    [call] = done.choices[0].message.tool_calls
    assert done.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages.append(done.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
    after = client.chat.completions.create(model="v/tool-call", messages=messages, tools=[WEATHER])
    assert after.choices[0].message.content == "The tool said: sunny"
    _, second = fake.sent(marker=marker)
    [replayed] = second.body["contents"][1]["parts"]
    assert replayed["thoughtSignature"] == THOUGHT_SIGNATURE


def test_tool_call_streamed(client):
    chunks = list(
        client.chat.completions.create(
            **_chat("v/tool-call"), tools=[WEATHER], tool_choice="required", stream=True
        )
    )
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert [tc.function.name for tc in calls] == ["get_weather"]
    assert _finishes(chunks) == ["tool_calls"]


# --- usage, receipts, length -----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_usage_by_class(client, stream):
    if stream:
        chunks = list(
            client.chat.completions.create(
                **_chat("v/cached"), stream=True, stream_options={"include_usage": True}
            )
        )
        text, usage = _stream_text(chunks), chunks[-1].usage
    else:
        done = client.chat.completions.create(**_chat("v/cached"))
        text, usage = done.choices[0].message.content, done.usage
    assert text == REPLY
    assert (usage.prompt_tokens, usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    assert usage.prompt_tokens_details.cached_tokens == CACHED_TOKENS
    assert usage.completion_tokens_details.reasoning_tokens == THOUGHT_TOKENS


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_receipt_costs_usage_at_the_model_prices(http, stream):
    response = http.post("/v1/chat/completions", json=_chat("v/normal", stream=stream))
    assert response.status_code == 200
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    usage = receipt["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (INPUT_TOKENS, OUTPUT_TOKENS)
    assert receipt["cost"] == COST and receipt["provider"] == "vx"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_length(client, stream):
    if stream:
        chunks = list(client.chat.completions.create(**_chat("v/length"), stream=True))
        text, finishes = _stream_text(chunks), _finishes(chunks)
    else:
        done = client.chat.completions.create(**_chat("v/length"))
        text, finishes = done.choices[0].message.content, [done.choices[0].finish_reason]
    assert finishes == ["length"] and text == "".join(REPLY_PIECES[:2])


# --- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("mode", ["fault-401", "fault-403", "fault-429", "fault-500"])
def test_upstream_refusals_are_provider_errors(gw, http, mode, stream):
    response = http.post("/v1/chat/completions", json=_chat(f"v/{mode}", stream=stream))
    assert_error(response, 502, "provider_error")
    assert SECRET not in response.text and SECRET not in gw.log()
    if mode in ("fault-401", "fault-403"):
        assert _logged(gw, "credentials rejected by provider vx ")


def test_a_refused_assertion_is_rejected_credentials(gw, http, fake):
    marker = _marker()
    refused = fake.refused_assertions
    response = http.post("/v1/chat/completions", json=_chat("v/rogue", marker))
    assert_error(response, 502, "provider_error")
    assert fake.refused_assertions > refused  # the signature did not verify
    assert fake.sent(marker=marker) == []  # no token: nothing asked of the model
    assert _logged(gw, "credentials rejected by provider vx-rogue")


def test_a_refused_assertion_falls_back(http, fake):
    marker = _marker()
    response = http.post("/v1/chat/completions", json=_chat("v/rogue-falls-back", marker))
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-provider"] == "local"
    assert fake.sent(marker=marker) == []


@pytest.mark.parametrize("model", ["v/absent", "v/default"])
def test_no_credentials_is_not_configured(http, fake, model):
    """A named credentials_file absent; nothing named and no default credentials."""
    marker = _marker()
    token_requests = fake.token_requests
    response = http.post("/v1/chat/completions", json=_chat(model, marker))
    assert_error(response, 503, "service_unavailable")
    assert fake.sent(marker=marker) == [] and fake.token_requests == token_requests


def _in_band_errors(response: httpx.Response) -> list[str]:
    payloads = [p for p in sse_payloads(response.content) if isinstance(p, dict)]
    return [p["error"]["type"] for p in payloads if "error" in p]


def test_cut_mid_stream(http):
    response = http.post("/v1/chat/completions", json=_chat("v/cut-mid-stream", stream=True))
    assert response.status_code == 200 and _in_band_errors(response) == ["provider_error"]
    assert_error(
        http.post("/v1/chat/completions", json=_chat("v/cut-mid-stream")), 502, "provider_error"
    )


def test_an_error_in_the_stream(gw, http):
    response = http.post("/v1/chat/completions", json=_chat("v/stream-error", stream=True))
    assert response.status_code == 200 and _in_band_errors(response) == ["provider_error"]
    assert SECRET not in response.text and SECRET not in gw.log()


def test_malformed_answer(http):
    response = http.post("/v1/chat/completions", json=_chat(f"v/{MALFORMED}"))
    assert_error(response, 502, "provider_error")
    streamed = http.post("/v1/chat/completions", json=_chat(f"v/{MALFORMED}", stream=True))
    assert streamed.status_code == 200 and _in_band_errors(streamed) == ["provider_error"]


def test_no_embeddings(http, fake):
    before = len(fake.requests)
    response = http.post("/v1/embeddings", json={"model": "v/embed", "input": "x"})
    assert_error(response, 400, "invalid_request", param="model")
    assert len(fake.requests) == before


# --- application default credentials -----------------------------------------------------------


@pytest.fixture(scope="module")
def adc_gw(tmp_path_factory, fake):
    """A gateway whose vertex provider names nothing, in an environment whose
    GOOGLE_APPLICATION_CREDENTIALS is a service-account key."""
    folder = tmp_path_factory.mktemp("vertex-adc")
    config = _vertex_block("vx-default", fake.url) + model_block(
        "v/default", "vx-default", "normal"
    )
    process = GatewayProcess(folder, extra_config=config)
    _no_default_credentials(process, tmp_path_factory.mktemp("gcloud-adc"))
    path = fake.service_account_file(folder / "adc.json")
    process.env["GOOGLE_APPLICATION_CREDENTIALS"] = str(path)
    yield process.start()
    process.stop()


def test_application_default_credentials(adc_gw, fake):
    project = adc_gw.cli("projects", "create", "adc", "--balance", "10")["id"]
    key = adc_gw.create_key(project, "inference")
    marker = _marker()
    response = httpx.post(
        adc_gw.url + "/v1/chat/completions",
        json=_chat("v/default", marker),
        headers={"authorization": f"Bearer {key}"},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == REPLY
    [sent] = fake.sent(marker=marker)
    assert sent.headers["authorization"].removeprefix("Bearer ") in fake.issued
