"""The `azure` provider kind against a fake Azure OpenAI resource and a real gateway: chat
(plain and streamed) with the official openai SDK, tools, Responses (translated to chat),
embeddings, exact receipts; the `api-key` header, the api-version and the deployment
path as Azure checks them; a refused key (502, logged, a fallback trigger) and an unset
one (503, nothing sent)."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.support.errors import assert_error
from tests.support.fake_azure import FakeAzure
from tests.support.fake_openai import FAKE_DIMENSIONS, fake_embedding
from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, REPLY, SECRET
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import NO_BREAKER, by_class

WRONG_KEY = "azure-wrong-key-0f3a9e"
# Per million tokens: 11 in and 5 out cost 27.5 + 50, so 78 micro-units once rounded up.
INPUT_PRICE, OUTPUT_PRICE = 2_500_000, 10_000_000
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _cost(input_tokens: int, output_tokens: int = 0) -> str:
    micros = -(-(input_tokens * INPUT_PRICE + output_tokens * OUTPUT_PRICE) // 1_000_000)
    return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


def _model(model_id: str, provider: str, upstream: str, extra: str = "") -> str:
    return f"""
[models."{model_id}"]
provider = "{provider}"
upstream = "{upstream}"
input_price_per_mtok = "{INPUT_PRICE / 1e6}"
output_price_per_mtok = "{OUTPUT_PRICE / 1e6}"
supports_tools = true
{extra}
"""


def _azure(name: str, url: str, variable: str, api_version: str) -> str:
    return f"""
[providers.{name}]
kind = "azure"
base_url = "{url}"
api_key_env = "{variable}"
api_version = "{api_version}"
"""


@pytest.fixture(scope="module")
def fake():
    with FakeAzure() as fake:
        yield fake


@pytest.fixture(scope="module")
def gw(tmp_path_factory, fake):
    block, env = fake.provider_config("az")
    config = block + NO_BREAKER
    config += _azure("az-wrong", fake.url, "AZURE_TEST_WRONG_KEY", fake.api_version)
    config += _azure("az-version", fake.url, "FAKE_AZURE_KEY", "2023-05-15")
    config += _azure("az-unset", fake.url, "AZURE_TEST_KEY_NEVER_SET", fake.api_version)
    for mode in ("normal", "tool-call"):
        config += _model(f"az/{mode}", "az", mode)
    config += _model("az-embed/normal", "az", "normal", 'mode = "embedding"')
    config += _model("az-wrong/normal", "az-wrong", "normal")
    echo = 'fallbacks = [{provider = "local", upstream = "echo-1"}]'
    config += _model("az-wrong/falls-back", "az-wrong", "normal", echo)
    config += _model("az-version/normal", "az-version", "normal")
    config += _model("az-unset/normal", "az-unset", "normal")
    folder = tmp_path_factory.mktemp("azure")
    env = {**env, "AZURE_TEST_WRONG_KEY": WRONG_KEY}
    process = GatewayProcess(folder, extra_config=config, env=env)
    yield process.start()
    process.stop()


def _marker() -> str:
    return f"azure-{uuid.uuid4()}"


def _sent_once(fake: FakeAzure, marker: str, operation: str, deployment: str = "normal"):
    """The one request the fake received with `marker`, on the deployment's path, with the
    resource's key in `api-key` (and no other credential header)."""
    [sent] = fake.sent(marker=marker)
    assert sent.path == f"/openai/deployments/{deployment}/{operation}"
    assert sent.headers["api-key"] == fake.credential
    assert "authorization" not in sent.headers
    return sent


def _receipt(http, receipt_id: str) -> dict:
    receipt = http.get(f"/v1/receipts/{receipt_id}")
    assert receipt.status_code == 200, receipt.text
    return receipt.json()


def test_chat(client, http, fake):
    marker = _marker()
    raw = client.chat.completions.with_raw_response.create(
        model="az/normal", messages=[{"role": "user", "content": marker}]
    )
    done = raw.parse()
    assert done.model == "az/normal"
    assert done.choices[0].message.content == REPLY
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    sent = _sent_once(fake, marker, "chat/completions")
    assert sent.body["model"] == "normal"
    receipt = _receipt(http, raw.headers["x-receipt-id"])
    assert receipt["provider"] == "az"
    assert receipt["usage"]["input_tokens"] == INPUT_TOKENS
    assert receipt["usage"]["output_tokens"] == OUTPUT_TOKENS
    assert receipt["cost"] == _cost(INPUT_TOKENS, OUTPUT_TOKENS) == "0.000078"


def test_chat_stream(client, http, fake):
    marker = _marker()
    raw = client.chat.completions.with_raw_response.create(
        model="az/normal",
        messages=[{"role": "user", "content": marker}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(raw.parse())
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert "".join(deltas) == REPLY
    assert len(deltas) > 1, "not streamed"
    assert all(c.model == "az/normal" for c in chunks)
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    sent = _sent_once(fake, marker, "chat/completions")
    assert sent.body["stream"] is True
    assert sent.body["stream_options"]["include_usage"] is True
    receipt = _receipt(http, raw.headers["x-receipt-id"])
    assert receipt["status"] == "succeeded"
    assert receipt["cost"] == _cost(INPUT_TOKENS, OUTPUT_TOKENS)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_tools(client, fake, stream):
    marker = _marker()
    messages = [{"role": "user", "content": f"Weather in Paris? {marker}"}]
    asked = client.chat.completions.create(
        model="az/tool-call", messages=messages, tools=TOOLS, stream=stream
    )
    if stream:
        parts = [
            call
            for chunk in asked
            if chunk.choices
            for call in chunk.choices[0].delta.tool_calls or ()
        ]
        name = "".join(part.function.name or "" for part in parts)
        arguments = "".join(part.function.arguments or "" for part in parts)
        call_id = next(part.id for part in parts if part.id)
    else:
        [call] = asked.choices[0].message.tool_calls
        name, arguments, call_id = call.function.name, call.function.arguments, call.id
        assert asked.choices[0].finish_reason == "tool_calls"
    assert (name, arguments) == ("get_weather", '{"city": "Paris"}')
    _sent_once(fake, marker, "chat/completions", "tool-call")
    assistant = {
        "role": "assistant",
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }
    result = {"role": "tool", "tool_call_id": call_id, "content": "sunny"}
    answered = client.chat.completions.create(
        model="az/tool-call", messages=[*messages, assistant, result], tools=TOOLS
    )
    assert answered.choices[0].message.content == "The tool said: sunny"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_responses_are_translated_to_chat(client, fake, stream):
    marker = _marker()
    if stream:
        events = list(client.responses.create(model="az/normal", input=marker, stream=True))
        assert events[-1].type == "response.completed"
        response = events[-1].response
    else:
        response = client.responses.create(model="az/normal", input=marker)
    assert response.model == "az/normal"
    assert response.output_text == REPLY
    assert (response.usage.input_tokens, response.usage.output_tokens) == (
        INPUT_TOKENS,
        OUTPUT_TOKENS,
    )
    _sent_once(fake, marker, "chat/completions")  # no Responses endpoint was tried


def test_embeddings(client, http, fake):
    marker = _marker()
    raw = client.embeddings.with_raw_response.create(
        model="az-embed/normal", input=[marker, "second"], dimensions=4
    )
    answer = raw.parse()
    assert answer.model == "az-embed/normal"
    assert [item.embedding for item in answer.data] == [fake_embedding(i, 4) for i in range(2)]
    sent = _sent_once(fake, marker, "embeddings")
    assert sent.body == {
        "model": "normal",
        "input": [marker, "second"],
        "dimensions": 4,
        "encoding_format": "float",
    }
    receipt = _receipt(http, raw.headers["x-receipt-id"])
    assert receipt["usage"] == by_class(INPUT_TOKENS, 0)
    assert receipt["cost"] == _cost(INPUT_TOKENS)
    ids = client.embeddings.create(model="az-embed/normal", input=[[1, 2], [3]])
    assert [item.embedding for item in ids.data] == [
        fake_embedding(i, FAKE_DIMENSIONS) for i in range(2)
    ]


def _logged(process: GatewayProcess, request_id: str) -> list[str]:
    deadline = time.monotonic() + 5
    while f"request_id={request_id}" not in process.log():
        assert time.monotonic() < deadline, "the failure was not logged"
        time.sleep(0.05)
    return [line for line in process.log().splitlines() if request_id in line]


def test_a_refused_key_is_502_logged_and_falls_back(gw, http, fake):
    marker = _marker()
    response = http.post(
        "/v1/chat/completions",
        json={"model": "az-wrong/normal", "messages": [{"role": "user", "content": marker}]},
    )
    assert_error(response, 502, "provider_error")
    assert SECRET not in response.text
    [sent] = fake.sent(marker=marker)
    assert sent.headers["api-key"] == WRONG_KEY  # the fake refused it, as Azure would
    lines = _logged(gw, response.headers["x-request-id"])
    assert any("credentials rejected by provider az-wrong" in line for line in lines), lines
    assert WRONG_KEY not in gw.log() and fake.credential not in gw.log()

    marker = _marker()
    response = http.post(
        "/v1/chat/completions",
        json={"model": "az-wrong/falls-back", "messages": [{"role": "user", "content": marker}]},
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-provider"] == "local"
    assert response.json()["choices"][0]["message"]["content"] == marker  # echo's answer
    assert len(fake.sent(marker=marker)) == 1  # tried once, refused, then echo


def test_the_api_version_is_checked(http, fake):
    """A version the resource does not serve is Azure's 404, a client error here: the
    fake checks what the other tests send."""
    marker = _marker()
    response = http.post(
        "/v1/chat/completions",
        json={"model": "az-version/normal", "messages": [{"role": "user", "content": marker}]},
    )
    assert_error(response, 400, "invalid_request")
    assert len(fake.sent(marker=marker)) == 1


def test_an_unset_key_is_503_with_nothing_sent(http, fake):
    before = len(fake.requests)
    for path, body in [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"input": "hi"}),
    ]:
        response = http.post(path, json={"model": "az-unset/normal", **body})
        assert_error(response, 503, "service_unavailable")
    assert len(fake.requests) == before
