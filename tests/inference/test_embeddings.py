"""POST /v1/embeddings through a real gateway: the official openai SDK (floats and its
default base64), strings, token ids, `dimensions`, aliases, modes, bad inputs, exact
receipts, and upstream failures, against the echo provider and the fake OpenAI."""

from __future__ import annotations

import base64
import math
import struct
import uuid

import httpx
import openai
import orjson
import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens
from model_gateway.gateway.providers.echo.echo import MAX_EMBEDDING_VALUES, embedding
from tests.support.errors import assert_error
from tests.support.fake_openai import FAKE_DIMENSIONS, REVERSED, WRONG_COUNT, fake_embedding
from tests.support.fake_upstream import INPUT_TOKENS, MALFORMED, SECRET
from tests.support.gateway_process import GatewayProcess
from tests.support.http import chat_body
from tests.support.inference import NO_BREAKER, by_class

PRICE = "123.456789"  # per million input tokens: 11 tokens cost 1358.02, so 1359 micro-units
ECHO_DIMENSIONS = 8  # the echo provider's default vector length
FAILING = {
    "fault-500": (502, "provider_error"),
    "fault-401": (502, "provider_error"),
    MALFORMED: (502, "provider_error"),
    WRONG_COUNT: (502, "provider_error"),
    "cut-mid-stream": (502, "provider_error"),
    "fault-400": (400, "invalid_request"),
    "slow": (504, "provider_timeout"),
}
BROKEN_COUNTS = ["usage-string", "usage-huge", "usage-negative", "no-usage"]
OA_MODES = ["normal", REVERSED, *FAILING, *BROKEN_COUNTS]


def _cost(tokens: int) -> str:
    """The receipt's cost of `tokens` input tokens at PRICE, rounded up to the micro-unit."""
    micros = -(-tokens * 123_456_789 // 1_000_000)
    return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


def _embedding_model(model_id: str, provider: str, upstream: str, extra: str = "") -> str:
    # No output price: embeddings have no output.
    return f"""
[models."{model_id}"]
provider = "{provider}"
upstream = "{upstream}"
mode = "embedding"
input_price_per_mtok = "{PRICE}"
{extra}
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory, fake_openai):
    block, env = fake_openai.provider_config("fakeai")
    config = block + NO_BREAKER
    alias = 'aliases = ["text-embedding-3-small"]'
    config += _embedding_model("echo-embed", "local", "echo-embed", alias)
    config += "".join(_embedding_model(f"oa-embed/{mode}", "fakeai", mode) for mode in OA_MODES)
    fallback = 'fallbacks = [{provider = "local", upstream = "echo-embed"}]'
    config += _embedding_model("oa-embed/falls-back", "fakeai", "fault-500", fallback)
    folder = tmp_path_factory.mktemp("embeddings")
    process = GatewayProcess(folder, extra_config=config, env=env, gateway_timeout_s=1.5)
    yield process.start()
    process.stop()


@pytest.fixture(scope="module")
def key(gw) -> str:
    project = gw.cli("projects", "create", "embeddings", "--balance", "1000")["id"]
    return gw.create_key(project, "inference,receipts")


@pytest.fixture(scope="module")
def http(gw, key):
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(base_url=gw.url, headers=headers, timeout=20) as session:
        yield session


@pytest.fixture(scope="module")
def sent_bodies() -> list[dict]:
    """What the SDK client below sent, request by request."""
    return []


@pytest.fixture(scope="module")
def client(gw, key, sent_bodies):
    def record(request: httpx.Request) -> None:
        sent_bodies.append(orjson.loads(request.content))

    session = httpx.Client(event_hooks={"request": [record]}, timeout=20)
    yield openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, http_client=session)
    session.close()


def _receipt(http, response) -> dict:
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}")
    assert receipt.status_code == 200, receipt.text
    return receipt.json()


def _embed(http, model: str, **body) -> httpx.Response:
    return http.post("/v1/embeddings", json={"model": model, **body})


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(value * value for value in vector))


def test_listed_with_its_scope(http):
    listed = http.get("/v1").json()["data"]
    assert {"method": "POST", "path": "/v1/embeddings", "scope": "inference"} in listed


def test_sdk_default_is_base64_and_decodes_to_the_float_answer(client, sent_bodies):
    text = "The quick brown fox."
    as_floats = client.embeddings.create(model="echo-embed", input=text, encoding_format="float")
    assert sent_bodies[-1]["encoding_format"] == "float"
    by_default = client.embeddings.create(model="echo-embed", input=text)
    # The SDK asks for base64 unless told otherwise (numpy or not), and decodes it.
    assert sent_bodies[-1]["encoding_format"] == "base64"
    assert as_floats.object == "list" and as_floats.model == "echo-embed"
    vector = as_floats.data[0].embedding
    assert by_default.data[0].embedding == vector  # float32 values: base64 is exact
    assert vector == embedding(text, ECHO_DIMENSIONS)
    assert len(vector) == ECHO_DIMENSIONS
    assert _norm(vector) == pytest.approx(1, abs=1e-6)
    again = client.embeddings.create(model="echo-embed", input=text, encoding_format="float")
    assert again.data[0].embedding == vector  # deterministic
    other = client.embeddings.create(model="echo-embed", input=text + "!", encoding_format="float")
    assert other.data[0].embedding != vector
    assert (as_floats.usage.prompt_tokens, as_floats.usage.total_tokens) == (5, 5)


def test_base64_is_little_endian_float32(http):
    response = _embed(http, "echo-embed", input="hello", encoding_format="base64")
    assert response.status_code == 200, response.text
    item = response.json()["data"][0]
    assert item["object"] == "embedding" and item["index"] == 0
    raw = base64.b64decode(item["embedding"])
    assert len(raw) == 4 * ECHO_DIMENSIONS
    assert list(struct.unpack(f"<{ECHO_DIMENSIONS}f", raw)) == embedding("hello", ECHO_DIMENSIONS)


def test_a_list_of_strings_in_order_with_an_exact_receipt(http):
    texts = ["hello world", "abc", "hello world"]
    response = _embed(http, "echo-embed", input=texts)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert [item["index"] for item in answer["data"]] == [0, 1, 2]
    vectors = [item["embedding"] for item in answer["data"]]
    assert vectors == [embedding(text, ECHO_DIMENSIONS) for text in texts]
    assert vectors[0] == vectors[2] != vectors[1]
    tokens = sum(estimate_tokens(text) for text in texts)  # as the echo provider counts
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    receipt = _receipt(http, response)
    assert receipt["endpoint"] == "/v1/embeddings"
    assert receipt["status"] == "succeeded"
    assert receipt["usage"] == by_class(tokens, 0)
    assert receipt["usage_source"] == "provider"
    assert receipt["cost"] == _cost(tokens)


def test_token_ids(client):
    """As LangChain's OpenAIEmbeddings sends them: token ids, one list per input."""
    one = client.embeddings.create(model="echo-embed", input=[9906, 1917], encoding_format="float")
    assert len(one.data) == 1
    assert one.data[0].embedding == embedding([9906, 1917], ECHO_DIMENSIONS)
    assert one.usage.prompt_tokens == 2  # one token a token id
    lists = [[9906, 1917], [15339, 11, 1917]]
    many = client.embeddings.create(model="echo-embed", input=lists)
    assert [item.embedding for item in many.data] == [
        embedding(ids, ECHO_DIMENSIONS) for ids in lists
    ]
    assert many.usage.prompt_tokens == 5
    as_text = client.embeddings.create(model="echo-embed", input="[9906,1917]")
    assert as_text.data[0].embedding != one.data[0].embedding


def test_dimensions_shorten_the_vector(client):
    text = "Shorter, please."
    full = client.embeddings.create(model="echo-embed", input=text).data[0].embedding
    short = client.embeddings.create(model="echo-embed", input=text, dimensions=3)
    vector = short.data[0].embedding
    assert len(vector) == 3
    assert _norm(vector) == pytest.approx(1, abs=1e-6)
    prefix = full[:3]
    assert vector == pytest.approx([value / _norm(prefix) for value in prefix], abs=1e-6)


def test_echo_bounds_the_values_it_computes(http):
    response = _embed(http, "echo-embed", input="x", dimensions=MAX_EMBEDDING_VALUES + 1)
    assert_error(response, 400, "invalid_request", param="dimensions")
    assert "x-receipt-id" not in response.headers


def test_an_alias_is_answered_under_its_name(client, http):
    answer = client.embeddings.with_raw_response.create(
        model="text-embedding-3-small", input="alias", encoding_format="float"
    )
    assert answer.parse().model == "text-embedding-3-small"
    assert answer.parse().data[0].embedding == embedding("alias", ECHO_DIMENSIONS)
    receipt = _receipt(http, answer.http_response)
    assert receipt["model"] == "echo-embed"


def test_openai_upstream_floats_base64_dimensions_and_receipt(client, http, fake_openai):
    marker = f"embed-{uuid.uuid4()}"
    texts = [marker, "second"]
    floats = client.embeddings.with_raw_response.create(
        model="oa-embed/normal", input=texts, encoding_format="float", user="u-1"
    )
    assert [item.embedding for item in floats.parse().data] == [
        fake_embedding(i, FAKE_DIMENSIONS) for i in range(2)
    ]
    assert floats.parse().model == "oa-embed/normal"
    assert floats.parse().usage.prompt_tokens == INPUT_TOKENS
    [sent] = fake_openai.sent(marker=marker)
    assert sent.path == "/v1/embeddings"
    # Floats asked upstream whatever the client asked: the gateway encodes base64 itself.
    assert sent.body == {
        "model": "normal",
        "input": texts,
        "user": "u-1",
        "encoding_format": "float",
    }
    receipt = _receipt(http, floats.http_response)
    assert receipt["usage"] == by_class(INPUT_TOKENS, 0)
    assert receipt["usage_source"] == "provider"
    assert receipt["provider"] == "fakeai"
    assert receipt["cost"] == _cost(INPUT_TOKENS) == "0.001359"
    marker = f"embed-{uuid.uuid4()}"
    default = client.embeddings.create(model="oa-embed/normal", input=marker, dimensions=5)
    assert default.data[0].embedding == fake_embedding(0, 5)
    [sent] = fake_openai.sent(marker=marker)
    assert sent.body["dimensions"] == 5
    assert sent.body["input"] == [marker]  # a string goes as a list of one
    assert sent.body["encoding_format"] == "float"


def test_openai_upstream_gets_token_ids(client, fake_openai):
    ids = [[int(uuid.uuid4().int % 100_000), 7], [8]]
    answer = client.embeddings.create(model="oa-embed/normal", input=ids, encoding_format="float")
    assert len(answer.data) == 2
    assert any(r.body.get("input") == ids for r in fake_openai.sent(model="normal"))


def test_vectors_come_in_the_order_of_the_inputs(http):
    response = _embed(http, f"oa-embed/{REVERSED}", input=["a", "b", "c"])
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [item["index"] for item in data] == [0, 1, 2]
    assert [item["embedding"][0] for item in data] == [0.5, 1.5, 2.5]


@pytest.mark.parametrize("mode", BROKEN_COUNTS)
def test_a_broken_count_is_replaced_by_the_gateways(http, mode):
    text = "Count me, whatever the upstream says."
    response = _embed(http, f"oa-embed/{mode}", input=[text, "and me"])
    assert response.status_code == 200, response.text
    tokens = estimate_tokens(text + "and me")
    assert response.json()["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    receipt = _receipt(http, response)
    assert receipt["usage"] == by_class(tokens, 0)
    assert receipt["usage_source"] == "gateway"
    assert receipt["cost"] == _cost(tokens)


@pytest.mark.parametrize("mode", list(FAILING))
def test_upstream_failures(http, mode):
    status, error_type = FAILING[mode]
    response = _embed(http, f"oa-embed/{mode}", input="fail, please")
    assert_error(response, status, error_type)
    assert SECRET not in response.text
    assert "x-receipt-id" not in response.headers  # nothing billed


def test_a_failing_upstream_falls_back(http):
    response = _embed(http, "oa-embed/falls-back", input="fall back")
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-provider"] == "local"
    assert response.json()["data"][0]["embedding"] == embedding("fall back", ECHO_DIMENSIONS)
    assert response.json()["model"] == "oa-embed/falls-back"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": "echo-1", "input": "a chat model"}),
        ("/v1/chat/completions", chat_body("echo-embed")),
        ("/v1/responses", {"model": "text-embedding-3-small", "input": "an embedding model"}),
    ],
    ids=["chat-model-on-embeddings", "embedding-model-on-chat", "embedding-model-on-responses"],
)
def test_a_model_serves_only_its_mode(http, path, body):
    response = http.post(path, json=body)
    assert_error(response, 400, "invalid_request", param="model")
    assert "x-receipt-id" not in response.headers


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({}, "input"),
        ({"input": ["a", ""]}, "input.1"),
        ({"input": ["a", 1]}, "input.1"),
        ({"input": [[]]}, "input.0"),
        ({"input": [[1], ["a"]]}, "input.1.0"),
        ({"input": [[1], "a"]}, "input.1"),
        ({"input": [1, -2]}, "input.1"),
        ({"input": [True]}, "input.0"),
        ({"input": [[1.5]]}, "input.0.0"),
        ({"input": ["a"] * 2049}, "input"),
        ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "dimensions": "8"}, "dimensions"),
    ],
)
def test_bad_inputs_are_refused_with_their_param(http, fake_openai, body, param):
    before = len(fake_openai.requests)
    response = _embed(http, "oa-embed/normal", **body)
    assert_error(response, 400, "invalid_request", param=param)
    assert "x-receipt-id" not in response.headers  # refused before anything was held
    assert len(fake_openai.requests) == before
